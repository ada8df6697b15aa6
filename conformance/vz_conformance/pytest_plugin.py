"""pytest plugin of the vz conformance suite."""
