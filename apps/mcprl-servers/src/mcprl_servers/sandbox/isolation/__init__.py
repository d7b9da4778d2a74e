"""The isolation steps of the sandbox supervisor, standard library only: `mounts` (the filesystem), `limits`
(memory cgroup, IPC, rlimits), `credentials` (capabilities, uid, keyrings); `system` holds what they share.

The supervisor runs by path without site-packages and imports this folder as the top-level package
``isolation``, so its modules import each other relatively and nothing outside the standard library.
"""
