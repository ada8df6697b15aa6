"""The vz API client (docs/api.md). ``vz_core.api.pb``: the generated vz.api.v1 stubs and their wire conversion."""
