"""This machine: the environment probe, backend x op availability, each process's CPU share, the leak filter."""
