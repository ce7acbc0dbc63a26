"""Which Ray authentication token `pdserve up --ray` sends, and what it says when the head refuses it.
(Against a real `ray start` head with token authentication: tests/integration/test_ray_cluster.py.)"""

from __future__ import annotations

import pytest

from cli.commands.ray_options import ray_cluster_spec
from cli.main import build_parser
from launch.ray.auth import TokenChoice, choose_token, gcs_verdict, refusal_message

HOME_TOKEN = "~user/.ray/auth_token"   # a name only: choose_token reads no file


def choose(token_file: str = "", files: tuple[str, ...] = (), **environ: str) -> TokenChoice:
    return choose_token(token_file, environ, set(files), HOME_TOKEN)


def test_the_flag_wins_over_every_place_ray_looks_and_its_file_replaces_ray_auth_token():
    everywhere = ("/s/token", "/e/token", HOME_TOKEN)
    choice = choose("/s/token", everywhere, RAY_AUTH_TOKEN="abc", RAY_AUTH_TOKEN_PATH="/e/token")
    assert choice == TokenChoice("flag", "/s/token")
    assert choice.env_changes() == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": "/s/token", "RAY_AUTH_TOKEN": None}


def test_without_the_flag_rays_own_order_applies_token_variable_then_path_variable_then_home_file():
    files = ("/e/token", HOME_TOKEN)
    assert choose("", files, RAY_AUTH_TOKEN="abc", RAY_AUTH_TOKEN_PATH="/e/token") == TokenChoice("env-token")
    assert choose("", files, RAY_AUTH_TOKEN_PATH="/e/token") == TokenChoice("env-path", "/e/token")
    assert choose("", (HOME_TOKEN,)) == TokenChoice("default-file", HOME_TOKEN)


def test_a_token_found_turns_token_mode_on_which_ray_does_not_do_for_an_explicit_address():
    for choice in (TokenChoice("env-token"), TokenChoice("env-path", "/e/token"), TokenChoice("default-file", HOME_TOKEN)):
        assert choice.env_changes() == {"RAY_AUTH_MODE": "token"}


def test_no_token_anywhere_leaves_ray_alone():
    choice = choose("", ())
    assert (choice, choice.has_token, choice.env_changes()) == (TokenChoice("none"), False, {})
    assert choose("", (), RAY_AUTH_TOKEN="  ") == TokenChoice("none")


def test_auth_mode_disabled_set_by_the_user_is_respected():
    choice = choose("", (HOME_TOKEN,), RAY_AUTH_MODE="disabled")
    assert (choice, choice.env_changes()) == (TokenChoice("disabled"), {})


@pytest.mark.parametrize("token_file, files, environ, message", [
    ("/s/token", (), {}, "--ray-auth-token-file /s/token: no such file, or it is empty"),
    ("", (HOME_TOKEN,), {"RAY_AUTH_TOKEN_PATH": "/e/token"}, "RAY_AUTH_TOKEN_PATH=/e/token: no such file, or it is empty"),
    ("", (), {"RAY_AUTH_MODE": "token"}, "RAY_AUTH_MODE=token but no Ray authentication token was found"),
    ("/s/token", ("/s/token",), {"RAY_AUTH_MODE": "disabled"},
     "--ray-auth-token-file /s/token is given but RAY_AUTH_MODE=disabled"),
    ("", (), {"RAY_AUTH_MODE": "on"}, "RAY_AUTH_MODE='on': Ray knows 'token' and 'disabled'"),
])
def test_a_token_asked_for_but_missing_is_refused_with_what_to_fix(token_file, files, environ, message):
    with pytest.raises(ValueError, match=message) as refused:
        choose_token(token_file, environ, set(files), HOME_TOKEN)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("status, verdict", [
    ("OK", "serves"), ("UNAUTHENTICATED", "refused"), ("UNAVAILABLE", "unreachable"),
    ("DEADLINE_EXCEEDED", "unreachable"), ("UNIMPLEMENTED", "unknown"), ("INTERNAL", "unknown"),
])
def test_one_gcs_call_tells_whether_the_head_takes_this_driver(status, verdict):
    assert gcs_verdict(status) == verdict


def test_refused_without_a_token_says_where_pdserve_looked_and_how_to_get_the_token():
    message = refusal_message("10.0.0.1:6380", TokenChoice("none"))
    assert message.startswith("the Ray cluster at 10.0.0.1:6380 uses token authentication and pdserve found no token "
                              "(looked at --ray-auth-token-file, RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token).")
    assert "`ray get-auth-token` on the head node prints the cluster's token" in message
    assert "\n" not in message and "disabled" not in message


def test_refused_with_a_token_names_where_that_token_came_from():
    assert refusal_message("h:1", TokenChoice("flag", "/s/token")).startswith(
        "the Ray cluster at h:1 refused the token from --ray-auth-token-file /s/token: "
        "the cluster was started with another token.")
    from_home = refusal_message("h:1", TokenChoice("default-file", HOME_TOKEN))
    assert f"from ~/.ray/auth_token ({HOME_TOKEN}):" in from_home
    assert "from RAY_AUTH_TOKEN:" in refusal_message("h:1", TokenChoice("env-token"))


def test_refused_while_auth_is_disabled_here_says_to_unset_it():
    assert "RAY_AUTH_MODE=disabled in this environment: unset it" in refusal_message("h:1", TokenChoice("disabled"))


def test_the_token_file_option_reaches_the_spec():
    parse = build_parser().parse_args
    assert ray_cluster_spec(parse(["up", "--model", "/m", "--ray", "h:6380", "--ray-auth-token-file", "/s/t"])
                            ).auth_token_file == "/s/t"
    assert ray_cluster_spec(parse(["up", "--model", "/m", "--ray", "h:6380"])).auth_token_file == ""
