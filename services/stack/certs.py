"""`hoist certs rotate`: new route certificates for a running `hoist up --nats-nodes 3` stack,
taken up by each node on a reload, with no restart and no route dropped (natstls.rotate)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from services.stack import natstls
from services.stack.home import start_command
from services.stack.up import SINGLE, StackError, StackInfo, is_nats, reload_nats


def rotate_route_certs(data_dir: Path, say: Callable[[str], None]) -> natstls.Rotated:
    """Rotate the route CA and certificate of the cluster stack running in ``data_dir``,
    telling ``say`` of each step and each node; StackError says what to do when it cannot."""
    data_dir = Path(data_dir)
    info = StackInfo.read(data_dir)
    if info is None or not info.alive():
        raise StackError(
            f"no Hoist stack runs in {data_dir}: start it (`{start_command(data_dir)}`) and "
            "rotate then; or, with it down, delete its route-*.pem files and its next "
            "`hoist up` makes new ones"
        )
    nodes = sorted(n for n in info.pids if is_nats(n) and n != SINGLE)
    if not nodes:
        raise StackError(
            f"the stack in {data_dir} runs one nats-server, which has no routes and so no "
            "route certificates; a cluster stack (`hoist up --nats-nodes 3`, on a new data "
            "dir) has them"
        )
    tls = natstls.RouteTLS.in_dir(data_dir)
    missing = [f.name for f in tls.files() if not f.exists()]
    if missing:
        raise StackError(
            f"{', '.join(missing)} missing in {data_dir}: its nodes run on files since "
            f"deleted; restart the stack (`hoist down --data-dir {data_dir}`, then "
            f"`{start_command(data_dir)}`) to have new ones made"
        )
    say(f"rotating the route certificates of {', '.join(nodes)} in {data_dir}")

    def reload(step: int, what: str) -> None:
        say(f"step {step}/{len(natstls.ROTATION_STEPS)}: {what}")
        try:
            reload_nats(data_dir, info, lambda line: say(f"  {line}"))
        except StackError as e:
            raise StackError(
                f"{e}. The routes that are up stay up, and every node accepts the files as "
                "they are now: fix that node (or start it again), then run `hoist certs "
                "rotate` again to finish"
            ) from None

    return natstls.rotate(data_dir, reload)
