from tests.agent.agent_harness import store_fixture  # noqa: F401 - the `store` fixture
