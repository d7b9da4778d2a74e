"""What a run leaves on disk and shows: run directory, checkpoints, tracking, plots, progress."""
