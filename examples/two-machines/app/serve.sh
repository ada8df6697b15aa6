#!/bin/sh
# The app: a web server on port 8080 (exported to the host) whose page reads a greeting from db by name.
# Run it in app with:  vz exec -- sh /workspace/app/serve.sh
set -eu
exec httpd -p 8080 -h /workspace/app/www
