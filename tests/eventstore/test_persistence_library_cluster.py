"""The library's recorder and application suites (test_persistence_library.py) on a
three-node JetStream cluster, every stream at R3: a conflict there comes back as the
replicated stream's "wrong last sequence" (err_code 10164, no sequence named), which must be
the library's IntegrityError as on one server, and a follower's answer must never decide one."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from unittest import TestCase

from services.stack.natsserver import NatsCluster
from tests.eventstore import test_persistence_library as one


def setUpModule() -> None:
    one.cluster = NatsCluster(Path(tempfile.mkdtemp(prefix="es-lib-cluster-"))).start()


def tearDownModule() -> None:
    if one.cluster is not None:
        one.cluster.stop()
        shutil.rmtree(one.cluster.base_dir, ignore_errors=True)
        one.cluster = None


class TestAggregateRecorderOnCluster(one.TestAggregateRecorder):
    pass


class TestApplicationRecorderOnCluster(one.TestApplicationRecorder):
    pass


class TestNonInterleavingNotificationIdsOnCluster(one.TestNonInterleavingNotificationIds):
    pass


class TestTrackingRecorderOnCluster(one.TestTrackingRecorder):
    pass


class TestProcessRecorderOnCluster(one.TestProcessRecorder):
    pass


class TestApplicationRecorderFromServerOnCluster(one.TestApplicationRecorderFromServer):
    pass


class TestExampleApplicationOnCluster(one.TestExampleApplication):
    pass


class TestApplicationOnCluster(one.TestApplication):
    pass


class TestTheModulesStreamIsReplicated(TestCase):
    def test_a_factory_on_the_cluster_makes_its_stream_r3(self) -> None:
        datastore = one.new_factory(self).datastore
        info = datastore.run(datastore.store.js.stream_info(datastore.store.stream))
        assert info.config.num_replicas == 3, info.config
