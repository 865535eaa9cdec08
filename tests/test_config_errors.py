"""Configuration errors all at once, unknown names answered with the known ones,
closest first (issue 15)."""

import pytest

from ampd.cli.main import main
from ampd.config import load_config
from ampd.core.errors import InputError
from ampd.core.names import closest_first
from ampd.perf import catalog
from ampd.policy.systems import get_system
from ampd.run.sweep import workload_source


def test_four_bad_fields_in_four_sections_are_named_in_one_error(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[cluster]\nmodel = "Llama-3.1-70b-typo"\n'  # unknown model name
                    '[policy]\nalpha = "high"\n'  # wrong type
                    '[slo]\nttft_s = -1.0\n'  # out of range
                    '[workload]\nratee_per_s = 2.0\n')  # unknown key
    with pytest.raises(InputError) as caught:
        load_config(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: 4 problems:")
    assert "cluster.model: unknown model 'Llama-3.1-70b-typo'; known (closest first): Llama-3.1-70B," in message
    assert "policy.alpha: Input should be a valid number" in message
    assert "slo.ttft_s: Input should be greater than 0" in message
    assert "workload.ratee_per_s: unknown field 'ratee_per_s'; known (closest first): rate_per_s," in message


def test_the_sweep_table_is_checked_with_the_rest(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('system = "ampdd"\n[workload]\nname = "toolbenchh"\n'
                    '[sweep]\nsystems = ["pd-disag"]\n[[sweep.workloads]]\nworkload = "gaia"\nrates_per_s = [1.0]\n')
    with pytest.raises(InputError) as caught:
        load_config(path)
    message = str(caught.value)
    assert "3 problems" in message
    assert "system: unknown system 'ampdd'; known (closest first): ampd," in message
    assert "workload.name: unknown workload 'toolbenchh'; known (closest first): toolbench," in message
    assert "sweep.systems: unknown system 'pd-disag'; known (closest first): pd-disagg," in message


def test_a_misspelled_workload_lists_the_known_ones(capsys):
    assert main(["simulate", "--workload", "toolbenchh"]) == 2
    err = capsys.readouterr().err
    assert ("unknown workload 'toolbenchh'; known (closest first): toolbench, builtin:trtllm-swebench, "
            "builtin:mooncake-conversation, hotpotqa, dureader, gaia") in err
    assert "no such file" in err


def test_an_existing_file_is_a_trace_not_a_workload_name(tmp_path):
    path = tmp_path / "toolbenchh"
    path.write_text("")
    assert workload_source(str(path)) == {"name": None, "trace": str(path)}


@pytest.mark.parametrize("lookup, name, first", [
    (get_system, "pd-disag", "pd-disagg"),
    (catalog.model, "llama-3.1-8", "Llama-3.1-8B"),
    (catalog.gpu, "h100", "H100-SXM"),
])
def test_unknown_systems_models_and_gpus_list_the_closest_first(lookup, name, first):
    with pytest.raises(InputError, match=f"known \\(closest first\\): {first},"):
        lookup(name)


def test_closest_first_puts_names_that_begin_with_the_typo_first():
    # "h20" begins H20 and H200; H20 is the closer of the two (ratio 1 against 0.857).
    assert closest_first("h20", ["A100-80GB", "H200", "H20", "L40S"])[:2] == ["H20", "H200"]
    assert closest_first("gaai", ["toolbench", "gaia", "hotpotqa"])[0] == "gaia"
