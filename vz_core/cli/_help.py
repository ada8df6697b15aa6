"""The static top-level help (printed by bare `vz`: no state is read or written, nothing heavy is imported)."""

from __future__ import annotations

__all__ = ["TOP_HELP"]

TOP_HELP = """\
vz: reproducible, parallel Developer Environments on local hardware.

usage: vz <command> [options]

Environments (made from the nearest vz.json upward from here):
  up       create or reconcile an Environment and its Machines
  exec     run a command in a Machine:  vz exec [--environment E] [--machine M] [-e K=V] [-u U] [-w DIR]
           [-d] [-it] -- CMD...
  status   show Environments, Machines, drivers, state and drift; a Machine's log:
           vz status --logs [--machine M] [--service S] [--follow] [--tail N]
  stop     stop every Machine of an Environment
  delete   delete an Environment and everything it owns (Machines, volumes unless --keep-volumes, bindings)
  volume   list volumes (in use and kept) or remove a kept one:  vz volume list | rm NAME

Other:
  driver   list, add, verify or configure drivers (vz driver list | add MANIFEST | verify [NAME] |
           configure NAME [KEY=VALUE ...])
  daemon   the per-user vz daemon the commands above talk to (started on demand):
           vz daemon start | stop | status | logs | run
  guest    the vz Linux guest for vfkit and hyperv hosts, as a verified bundle:
           vz guest build --arch A --format F --out DIR | verify DIR | fetch DIR|URL
           | fetch RELEASE/SHA256SUMS --arch A --format F
  completion  print a shell's completion script:  source <(vz completion bash|zsh), or
           vz completion fish > ~/.config/fish/completions/vz.fish
  version  print the vz version
  help     this text, or `vz help <command>` for a command's options

Options the commands share may also come before the command: --json, --environment NAME|ID,
-f/--file PATH (`vz --json status`, `vz --environment feat exec -- sh`).

Selecting an Environment: --environment NAME|ID, else $VZ_ENVIRONMENT_ID, else this worktree's binding;
`vz up` creates "default" only when the project has none. A worktree bound to none of the project's
Environments fails and lists them; `vz up --environment NAME` binds it.

Exit codes: 0 ok, 1 backend failure, 2 user error, 3 not found, 4 conflict (ambiguous, busy, needs
--recreate), 69 no vz daemon available, 130 interrupted; `vz exec` exits with the command's code
(128+N when killed by signal N), 125 when vz itself failed, 126 command not executable, 127 not found.

Start here:  vz up && vz exec -- echo hello
"""
