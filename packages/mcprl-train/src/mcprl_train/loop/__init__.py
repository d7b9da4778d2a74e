"""The training loop: trainer, learner, collection, evaluation, warm start, task stream."""
