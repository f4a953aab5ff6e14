"""Test infrastructure: a real Docker Engine, a real registry and busybox images built for tests."""
