"""Runtimes the agent drives: ``DockerRuntime`` (a real Docker Engine), ``DummyRuntime``."""

from agent.runtime.base import (
    Capacity,
    ImageInUse,
    ImageNotFound,
    ImageProgress,
    KernelContainer,
    KernelCreateError,
    KernelExists,
    PulledImage,
    PullError,
    PullProgress,
    Runtime,
    TransientPullError,
    Unauthorized,
)

__all__ = [
    "Capacity",
    "ImageInUse",
    "ImageNotFound",
    "ImageProgress",
    "KernelContainer",
    "KernelCreateError",
    "KernelExists",
    "PullError",
    "PullProgress",
    "PulledImage",
    "Runtime",
    "TransientPullError",
    "Unauthorized",
]
