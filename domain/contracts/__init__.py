"""The manager's wire contracts: what each command and query subject takes and answers.

One module per area; the subjects themselves are in domain.subjects.

- ``sessions``: create, get, destroy a session; a superadmin's kernel cancel.
- ``policies``: prepull policies (set, remove, list, plan).
- ``images``: preload jobs and unload across the fleet.
- ``agents``: agent resource sync and its triggers.
- ``queries``: the read-model queries, the admin's SQL and verify.

Requests are msgspec structs decoded strictly (``forbid_unknown_fields``) by domain.rpc.decode;
every failure answers ``{"error": {"code", "message"}}`` and changed nothing.  Pure: msgspec and
domain only, so a client (the CLI) needs nothing of the manager to call it.
"""
