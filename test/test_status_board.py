"""The verify gate's waits without ROS: a wait ends on what it waits for (put by another
thread), fails when a node stopped or its progress stood still, and a status said before the
action it answers is not missed; the sim's episode end is judged by its step count."""

import threading

import pytest

from claw_rl_ros.core.verify.status_board import GraphGone, StatusBoard
from claw_rl_ros.core.verify.gate_scoring import episode_end, latency_of


def test_a_wait_ends_on_a_status_put_by_another_thread():
    board = StatusBoard(lambda: True)
    seq = board.count('/sim_node')
    later = threading.Timer(0.05, board.put_status, ('/sim_node', {'paused': 'True'}))
    later.start()
    assert board.next_status('/sim_node', lambda v: v['paused'] == 'True', seq) == {
        'paused': 'True'}
    later.join()


def test_a_status_said_before_the_wait_counts_when_the_wait_names_its_sequence():
    board = StatusBoard(lambda: True, timeout_s=0.3)
    board.put_status('/sim_node', {'paused': 'False'})
    seq = board.count('/sim_node')
    board.put_status('/sim_node', {'paused': 'True'})  # the answer came before the wait
    assert board.next_status('/sim_node', lambda v: v['paused'] == 'True', seq)['paused'] == \
        'True'
    with pytest.raises(GraphGone, match='nothing moved for 0.3 s'):
        board.next_status('/sim_node')  # (no newer one: a stall, not a hang)


def test_a_wait_fails_when_a_node_stopped():
    running = [True]
    board = StatusBoard(lambda: running[0])
    running[0] = False
    with pytest.raises(GraphGone, match='a node of the graph stopped while waiting for x'):
        board.wait('x', lambda: False)


def test_records_and_versions_wake_their_waits():
    board = StatusBoard(lambda: True)
    threading.Timer(0.02, board.put_record, ('r1',)).start()
    assert board.wait('record', lambda: board.records > 0 and board.record) == 'r1'
    threading.Timer(0.02, board.put_version, ('abc',)).start()
    assert board.wait('version', lambda: board.version == 'abc')


def test_the_episode_ends_at_its_step_and_a_wrong_one_is_named():
    assert episode_end({'paused': 'False', 'steps': '600'}, 100, 600) is None
    assert episode_end({'paused': 'True', 'steps': '100'}, 100, 600) is None  # before the run
    assert episode_end({'paused': 'True', 'steps': '600', 'falls': '0'}, 100, 600) == {
        'paused': 'True', 'steps': '600', 'falls': '0'}
    with pytest.raises(ValueError, match='paused at step 599, not at the episode end 600'):
        episode_end({'paused': 'True', 'steps': '599'}, 100, 600)
    rows = latency_of({'latency_p99_ms': '0.5', 'latency_p50_ms': '0.2'},
                      {'command_latency_p99_ms': '1.25'})
    assert rows == {'latency_p99_ms': 0.5, 'latency_p50_ms': 0.2, 'round_trip_p99_ms': 1.25}
