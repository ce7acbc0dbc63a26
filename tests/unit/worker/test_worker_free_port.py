"""A worker's KV port is chosen where no outgoing connection can take it before vLLM binds it."""

import socket

from pdserve.worker.config import LISTEN_PORTS_FROM, ephemeral_range, free_port


def test_the_ephemeral_range_is_read_from_the_kernels_text_with_linuxs_default_otherwise():
    assert ephemeral_range("32768\t60999\n") == (32768, 60999)
    assert ephemeral_range("1024 65535") == (1024, 65535)
    assert ephemeral_range("") == (32768, 60999) and ephemeral_range("garbage") == (32768, 60999)


def test_a_free_port_lies_below_the_ephemeral_range_and_can_be_bound():
    low, _ = ephemeral_range()
    port = free_port("127.0.0.1")
    assert LISTEN_PORTS_FROM <= port < low or low <= LISTEN_PORTS_FROM
    with socket.create_server(("127.0.0.1", port)):
        pass
