"""Driver resolution, driver options, and the library behind ``vz driver list | add | verify | configure``.

A driver name is a name, never a path: one grammar (``DRIVER_NAME_PATTERN``, ``check_driver_name``) for
built-in drivers, external manifests and a Machine's ``driver`` in vz.json, checked before anything is looked
up. A name resolves to exactly one driver:

* **built-in** (``vz.drivers`` entry points, ``vz_core.registry``): Python code of this vz installation. Its
  plugin runs as ``<this interpreter> -c PLUGIN_MAIN --module REGISTRATION NAME`` (options in
  ``VZ_DRIVER_OPTIONS``), i.e. ``vz_plugins.plugin_main``: the shared
  plugin main its console script uses too, i.e. the same code the host would import in-process, launched
  through the same door (supervisor, handshake, AutoMTLS) as any external driver. This launch (what
  ``remote_driver`` does outside the daemon) is not checksummed: it runs this interpreter on this
  installation's modules, which the host already trusts by running them.
  ``builtin_manifest()`` writes a manifest for a built-in's console script (with its SHA-256 now) for use by
  other hosts or to run a built-in through the external path.
* **built-in, pinned** (what the vz daemon launches): ``pin_builtin()`` builds the manifest-equivalent record of
  a built-in's installed console script (``vz-driver-<name>``, i.e. ``<registration>:main``) in memory: its
  SHA-256 is taken once, checked against the hash the installer wrote in the distribution's ``RECORD`` when
  there is one, and its ``#!`` interpreter must be this interpreter. ``ResolvedDriver.launch_spec`` then
  verifies the script with ``vz_core.trust.verify_binary`` at **every** launch and executes the sealed copy of
  the verified bytes, exactly like an external binary; the registration module's source file is pinned and
  checked at every launch too. A declaration without a console script gets a launcher script generated into a
  private directory (``launcher_dir``), pinned the same way. What that covers: the console script (which names
  the interpreter and the registration module it imports) and the registration module. The interpreter and
  the rest of the installed packages (site-packages, the editable source tree, the driver's own code) are not
  hashed: they are the code the daemon itself runs (same ``sys.executable``; the daemon's fingerprint names
  it), so a hash of them taken by that code would prove nothing the daemon does not already trust by running.
* **external**: added from a manifest (``vz_core.trust``) with ``add_manifest``; the validated manifest is
  recorded under ``<state dir>/driver-manifests/<name>.json`` together with its directory (where relative
  binary paths live). A record is found only among the drivers the user added: by exact name among the
  recorded files (never by joining a name into a path), not through a symlink, and only if the manifest it
  holds carries that same name. Its binary is verified before **every** launch.

Driver options come from two places. A Machine's ``driver_options`` in vz.json may set only options whose
declared scope is ``"project"``; ``validate_project_options`` refuses any other key, naming it and where to set
it instead. Options of scope ``"host"`` (binaries, host paths, host networks) live in the user's **host
configuration**, ``<state dir>/config/drivers.json`` (``HostConfig``; ``vz driver configure NAME KEY=VALUE``)::

    {"linux_native": {"subnet": "10.77.0.0/16", "runc": "/opt/runc/bin/runc"}, "qemu": {"accelerator": "tcg"}}

``effective_options`` merges both (a project value wins for a project option) and ``open_driver`` builds the
driver with them. External drivers take no options from vz (their own configuration applies).

The functions return plain data (dicts of str/bool/list) for the CLI and ``--json``.
"""

from __future__ import annotations

from vz_core.drivers._launch import PLUGIN_MAIN, ResolvedDriver, launcher_for, remote_driver, resolve
from vz_core.drivers._manifests import ExternalRecord, ManifestStore
from vz_core.drivers._options import (
    HOST_CONFIG_FILE,
    HostConfig,
    driver_key,
    effective_options,
    host_config_path,
    validate_project_options,
)
from vz_core.drivers._pinned import PinnedScript
from vz_core.drivers._pinning import pin_builtin
from vz_core.drivers._source import DriverSource, open_driver
from vz_core.drivers._verbs import add_manifest, builtin_manifest, configure, list_drivers, verify
from vz_core.registry import DRIVER_NAME_PATTERN, check_driver_name

__all__ = [
    "DRIVER_NAME_PATTERN",
    "HOST_CONFIG_FILE",
    "PLUGIN_MAIN",
    "DriverSource",
    "ExternalRecord",
    "HostConfig",
    "ManifestStore",
    "PinnedScript",
    "ResolvedDriver",
    "add_manifest",
    "builtin_manifest",
    "check_driver_name",
    "configure",
    "driver_key",
    "effective_options",
    "host_config_path",
    "launcher_for",
    "list_drivers",
    "open_driver",
    "pin_builtin",
    "remote_driver",
    "resolve",
    "validate_project_options",
    "verify",
]
