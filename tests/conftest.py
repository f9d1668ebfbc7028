"""How the suite runs in parallel (`make test`: pytest-xdist, `-n N --dist loadgroup`).

Tests that share a module- or session-scoped fixture of this tree (a recording, a build) run on
one worker, so that what the fixture makes is made once, not once per worker; every other test
is scheduled on its own. The biggest groups go first (xdist's loadscope reordering), so that a
long group does not start last.

pytest-xdist groups by rewriting each test's node id in the workers, which pytest 9 no longer
lets it do; so the workers write each test's group to a file instead (one per worker, in a
folder the controller names in TESTS_XDIST_GROUPS_DIR), and the controller's scheduler reads them.
"""
import json
import os
import tempfile
from pathlib import Path

import pytest

# Not TORCHRR_*: tests check that a recorded program sees no TORCHRR_* variable it was not given.
GROUPS_ENV = "TESTS_XDIST_GROUPS_DIR"
# The scopes whose fixtures hold work that the tests using them share.
SHARED_SCOPES = ("module", "package", "session")


def _is_worker(config):
    return hasattr(config, "workerinput")


def pytest_configure(config):
    # The controller, before it starts the workers, which inherit the folder's name.
    if not _is_worker(config) and config.pluginmanager.hasplugin("xdist") and \
            config.getoption("dist", "no") == "loadgroup":
        os.environ[GROUPS_ENV] = tempfile.mkdtemp(prefix="torchrr-test-groups-")


def shared_fixtures(item):
    """The module- and session-scoped fixtures of this tree that `item` uses, sorted."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    return sorted(f"{definitions[-1].baseid}::{name}"
                  for name, definitions in info.name2fixturedefs.items()
                  if definitions and definitions[-1].baseid
                  and definitions[-1].scope in SHARED_SCOPES)


def pytest_collection_modifyitems(config, items):
    folder = os.environ.get(GROUPS_ENV)
    if not _is_worker(config) or not folder:
        return
    groups = {item.nodeid: "+".join(shared) for item in items if (shared := shared_fixtures(item))}
    path = Path(folder) / f"{config.workerinput['workerid']}.json"
    path.with_suffix(".tmp").write_text(json.dumps(groups))
    path.with_suffix(".tmp").replace(path)


def pytest_xdist_make_scheduler(config, log):
    folder = os.environ.get(GROUPS_ENV)
    if not folder:
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):
        """xdist's loadscope, with a test's scope its shared fixtures' group, or itself."""

        _groups = None

        def _split_scope(self, nodeid):
            if self._groups is None:
                # Read once every worker has collected: each wrote its file before it reported
                # its collection, which is what makes the controller schedule.
                self._groups = {}
                for path in Path(folder).glob("*.json"):
                    self._groups.update(json.loads(path.read_text()))
            return self._groups.get(nodeid, nodeid)

    return SharedFixtureScheduling(config, log)
