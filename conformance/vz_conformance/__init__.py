"""The vz conformance suite."""
