"""ALFWorld and WebShop adapters: clear errors without their package/data; text handling without data."""

import importlib.util

import pytest

from crl_jax.envs import alfworld_adapter, registry, webshop_adapter
from crl_jax.envs.alfworld_adapter import (ALFWorldEnv, build_config, check_data, clean_observation,
                                           extract_goal, format_observation, parse_command)
from crl_jax.envs.webshop_adapter import (WebShopEnv, available_action_strings,
                                          parse_webshop_action)

ALFWORLD_FIRST = ("-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking "
                  "quickly around you, you see a cabinet 1, a coffeemachine 1, and a sinkbasin 1.\n\n"
                  "Your task is to: put a clean mug in coffeemachine.")
ADMISSIBLE = ["go to cabinet 1", "go to coffeemachine 1", "go to sinkbasin 1", "inventory", "look"]


def test_alfworld_text_handling():
    assert clean_observation(ALFWORLD_FIRST).startswith("You are in the middle of a room.")
    assert "Welcome" not in clean_observation(ALFWORLD_FIRST)
    assert extract_goal(ALFWORLD_FIRST) == "put a clean mug in coffeemachine."
    assert extract_goal("no task here") == ""
    shown = format_observation(ALFWORLD_FIRST, ADMISSIBLE)
    assert shown.endswith("Available actions: " + ", ".join(ADMISSIBLE))
    assert format_observation("You arrive at cabinet 1.", None) == "You arrive at cabinet 1."


def test_alfworld_action_parsing():
    assert parse_command("think... <answer>Go to  Cabinet 1</answer>", ADMISSIBLE) == "go to cabinet 1"
    assert parse_command("<answer>look</answer> then <answer>inventory</answer>", ADMISSIBLE) == "inventory"
    assert parse_command("<answer>go to fridge 1</answer>", ADMISSIBLE) is None
    assert parse_command("go to cabinet 1", ADMISSIBLE) is None


def test_alfworld_data_check_names_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError) as error:
        check_data(str(tmp_path), "eval_out_of_distribution")
    message = str(error.value)
    assert "valid_unseen" in message and "alfred.pddl" in message and "ALFWORLD_DATA" in message
    (tmp_path / "json_2.1.1" / "valid_unseen").mkdir(parents=True)
    (tmp_path / "logic").mkdir()
    (tmp_path / "logic" / "alfred.pddl").write_text("")
    (tmp_path / "logic" / "alfred.twl2").write_text("")
    check_data(str(tmp_path), "eval_out_of_distribution")
    config = build_config(str(tmp_path))
    assert config["dataset"]["eval_ood_data_path"].endswith("valid_unseen")
    assert config["logic"]["grammar"].endswith("alfred.twl2")


def test_alfworld_env_fails_clearly(tmp_path, monkeypatch):
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "nowhere"))
    if importlib.util.find_spec("alfworld") is None:
        with pytest.raises(ImportError, match=r"alfworld.*pip install alfworld.*ALFWORLD_DATA"):
            registry.make("alfworld/data")
    else:
        with pytest.raises(FileNotFoundError, match="ALFWORLD_DATA"):
            registry.make("alfworld/data")
    with pytest.raises(ValueError, match="unknown split"):
        ALFWorldEnv(split="valid")


WEBSHOP_RAW = ("WebShop [SEP] Instruction: [SEP] i need a blue hoodie, and price lower than 40.00 "
               "dollars [SEP] Search")
RESULTS = {"has_search_bar": False,
           "clickables": ["back to search", "next >", "b09kp78g37", "b098xt346y"]}


def test_webshop_text_handling():
    start = {"has_search_bar": True, "clickables": ["search"]}
    shown = webshop_adapter.format_observation(WEBSHOP_RAW, start)
    assert shown.splitlines()[:3] == ["WebShop", "Instruction:",
                                      "i need a blue hoodie, and price lower than 40.00 dollars"]
    assert shown.endswith("Available actions: search[<keywords>]")
    assert available_action_strings(RESULTS) == ["click[back to search]", "click[next >]",
                                                 "click[b09kp78g37]", "click[b098xt346y]"]


def test_webshop_action_parsing():
    start = {"has_search_bar": True, "clickables": ["search"]}
    assert parse_webshop_action("<answer>search[ blue hoodie ]</answer>", start) == "search[blue hoodie]"
    assert parse_webshop_action("<answer>search[<keywords>]</answer>", start) is None
    assert parse_webshop_action("<answer>click[search]</answer>", start) is None
    assert parse_webshop_action("<answer>click[B09KP78G37]</answer>", RESULTS) == "click[b09kp78g37]"
    assert parse_webshop_action("<answer>click[Next >]</answer>", RESULTS) == "click[next >]"
    assert parse_webshop_action("<answer>search[hoodie]</answer>", RESULTS) is None
    assert parse_webshop_action("<answer>click[b000000000]</answer>", RESULTS) is None
    assert parse_webshop_action("click[next >]", RESULTS) is None


def test_webshop_env_fails_clearly(tmp_path, monkeypatch):
    if importlib.util.find_spec("web_agent_site") is not None:
        pytest.skip("WebShop is installed here; the missing-package message cannot be checked")
    monkeypatch.setenv("WEBSHOP_ROOT", str(tmp_path))
    with pytest.raises(ImportError, match=r"web_agent_site.*princeton-nlp/WebShop.*WEBSHOP_ROOT"):
        registry.make("webshop/data")
    with pytest.raises(ImportError, match="setup.sh"):
        WebShopEnv()


def test_adapters_share_the_protocol_prompts():
    for module in (alfworld_adapter, webshop_adapter):
        assert "<answer>" in module.SYSTEM_PROMPT
