"""vz core: the host, the Driver contract, and everything shared."""
