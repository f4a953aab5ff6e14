from transport.client import Client


async def test_nats_server_has_jetstream(nc: Client) -> None:
    info = await nc.jetstream().account_info()
    assert info.limits is not None
