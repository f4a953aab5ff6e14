"""The eventsourcing library's own recorder, factory and application test suites, run on
JetStream.

Passing them is the proof that the persistence module keeps the library's documented recorder
semantics. One real nats-server serves the module (a three-node cluster serves the same suites
in test_persistence_library_cluster.py); every recorder gets a fresh stream, so notification ids
start at 1 as the suites expect.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any
from unittest import TestCase

from eventsourcing.persistence import InfrastructureFactory
from eventsourcing.tests import application as lib_app
from eventsourcing.tests import persistence as lib
from eventsourcing.utils import Environment

from eventstore.persistence import (
    Factory,
    JetStreamAggregateRecorder,
    JetStreamApplicationRecorder,
    JetStreamProcessRecorder,
    JetStreamTrackingRecorder,
)
from services.stack.natsserver import NatsCluster, NatsServer

_server: NatsServer | None = None
cluster: NatsCluster | None = None  # set by the cluster's module while its suites run


def setUpModule() -> None:
    global _server
    _server = NatsServer(Path(tempfile.mkdtemp(prefix="es-lib-"))).start()


def tearDownModule() -> None:
    if _server is not None:
        _server.stop()
        shutil.rmtree(_server.store_dir, ignore_errors=True)


def server_url() -> str:
    if cluster is not None:
        return cluster.url
    assert _server is not None, "setUpModule starts the nats-server"
    return _server.url


def new_stream() -> str:
    return f"lib-{uuid.uuid4().hex[:12]}"


def new_factory(case: TestCase, **env: str) -> Factory:
    env = {**env, **getattr(case, "factory_env", {})}
    factory = Factory({"NATS_URL": server_url(), "NATS_STREAM": new_stream(), **env})
    case.addCleanup(factory.close)
    return factory


class TestAggregateRecorder(lib.AggregateRecorderTestCase):
    def create_recorder(self) -> JetStreamAggregateRecorder:
        recorder = new_factory(self).aggregate_recorder()
        assert isinstance(recorder, JetStreamAggregateRecorder)
        return recorder


class TestAggregateRecorderWithStrIds(TestAggregateRecorder):
    """Arbitrary string ids (dots, spaces, wildcards, unicode) become safe subject tokens."""

    def new_originator_id(self) -> str:
        return f"order.{uuid.uuid4()} * > ü/é"


class TestSnapshotRecorder(TestAggregateRecorder):
    def create_recorder(self) -> JetStreamAggregateRecorder:
        recorder = new_factory(self).aggregate_recorder(purpose="snapshots")
        assert isinstance(recorder, JetStreamAggregateRecorder)
        return recorder


class TestApplicationRecorder(lib.ApplicationRecorderTestCase[JetStreamApplicationRecorder]):
    def create_recorder(self) -> JetStreamApplicationRecorder:
        recorder = new_factory(self).application_recorder()
        assert isinstance(recorder, JetStreamApplicationRecorder)
        return recorder

    def test_insert_subscribe(self) -> None:
        self.optional_test_insert_subscribe()


class TestNonInterleavingNotificationIds(lib.NonInterleavingNotificationIDsBaseCase):
    def create_recorder(self) -> JetStreamApplicationRecorder:
        recorder = new_factory(self).application_recorder()
        assert isinstance(recorder, JetStreamApplicationRecorder)
        return recorder


class TestTrackingRecorder(lib.TrackingRecorderTestCase):
    def create_recorder(self) -> JetStreamTrackingRecorder:
        return new_factory(self).tracking_recorder()


class TestProcessRecorder(lib.ProcessRecorderTestCase):
    def create_recorder(self) -> JetStreamProcessRecorder:
        recorder = new_factory(self).process_recorder()
        assert isinstance(recorder, JetStreamProcessRecorder)
        return recorder


class _TrackingRecorderSubclass(JetStreamTrackingRecorder):
    pass


class TestFactory(lib.InfrastructureFactoryTestCase[Factory]):
    def setUp(self) -> None:
        self.env = Environment(
            "TestCase",
            {
                InfrastructureFactory.PERSISTENCE_MODULE: "eventstore:Factory",
                Factory.NATS_URL: server_url(),
                Factory.NATS_STREAM: new_stream(),
            },
        )
        super().setUp()

    def expected_factory_class(self) -> type[Factory]:
        return Factory

    def expected_aggregate_recorder_class(self) -> type[Any]:
        return JetStreamAggregateRecorder

    def expected_application_recorder_class(self) -> type[Any]:
        return JetStreamApplicationRecorder

    def expected_tracking_recorder_class(self) -> type[Any]:
        return JetStreamTrackingRecorder

    def tracking_recorder_subclass(self) -> type[Any]:
        return _TrackingRecorderSubclass

    def expected_process_recorder_class(self) -> type[Any]:
        return JetStreamProcessRecorder


# The same suites with no local copy (NATS_LOCAL_COPY_MB=0): every read goes to the server, as
# for a stream larger than the copy's bound or before the copy has caught up.
FROM_SERVER = {"NATS_LOCAL_COPY_MB": "0"}


class TestAggregateRecorderFromServer(TestAggregateRecorder):
    factory_env = FROM_SERVER


class TestApplicationRecorderFromServer(TestApplicationRecorder):
    factory_env = FROM_SERVER

    def test_the_copy_is_off(self) -> None:
        assert not self.create_recorder().datastore.copy.enabled


class TestProcessRecorderFromServer(TestProcessRecorder):
    factory_env = FROM_SERVER


class _OnJetStream(TestCase):
    """Applications constructed in the test read the persistence settings from the process
    environment, as the library's own application tests do."""

    def setUp(self) -> None:
        settings = {
            InfrastructureFactory.PERSISTENCE_MODULE: "eventstore:Factory",
            Factory.NATS_URL: server_url(),
            Factory.NATS_STREAM: new_stream(),
        }
        saved = {name: os.environ.get(name) for name in settings}
        os.environ.update(settings)
        self.addCleanup(_restore, saved)
        super().setUp()


def _restore(saved: dict[str, str | None]) -> None:
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


class TestExampleApplication(_OnJetStream, lib_app.ExampleApplicationTestCase):
    expected_factory_topic = "eventstore.persistence:Factory"


class TestApplication(_OnJetStream, lib_app.ApplicationTestCase):
    pass
