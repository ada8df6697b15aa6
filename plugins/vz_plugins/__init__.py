"""The vz plugin SDK: serve any Driver as a Runtime Protocol plugin."""
