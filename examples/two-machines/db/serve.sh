#!/bin/sh
# The database: a key-value store over HTTP on port 5984 (busybox httpd + one CGI script), its data in the
# named volume /var/lib/db. Run it in db with:  vz exec --machine db -- sh /workspace/db/serve.sh
set -eu
mkdir -p /var/lib/db/keys
exec httpd -p 5984 -h /workspace/db
