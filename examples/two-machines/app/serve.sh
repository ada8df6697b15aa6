#!/bin/sh
# The app: a web server on port 8080 (exported to the host) whose page reads a greeting from db by name.
# vz.json runs it as app's service "http", once db's kv is healthy; httpd stays in the foreground (-f) so that the
# agent supervises it.
set -eu
exec httpd -f -p 8080 -h /workspace/app/www
