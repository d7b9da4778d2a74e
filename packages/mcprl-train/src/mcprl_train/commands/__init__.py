"""Subcommands beside training: the memory plan and the setup check."""
