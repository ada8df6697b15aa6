#!/bin/sh
# The database: a key-value store over HTTP on port 5984 (busybox httpd + one CGI script), its data in the
# named volume /var/lib/db (whose keys/ directory the Machine's setup step made). vz.json runs it as db's
# service "kv"; httpd stays in the foreground (-f) so that the agent supervises it.
set -eu
exec httpd -f -p 5984 -h /workspace/db
