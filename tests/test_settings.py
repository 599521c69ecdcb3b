"""Home resolution and settings precedence / validation (issue 2, "Home and settings")."""


import pytest

from optimizer_pipeline.settings import Settings, SettingsError, load_settings, resolve_home


def test_home_precedence_cli_over_env_over_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_home(None, {}) == tmp_path / ".optimizer"
    assert resolve_home(None, {"OPTIMIZER_HOME": "env-home"}) == tmp_path / "env-home"
    assert resolve_home("cli-home", {"OPTIMIZER_HOME": "env-home"}) == tmp_path / "cli-home"


def test_defaults_without_file_or_environment(tmp_path):
    settings = load_settings(tmp_path, {})
    assert settings == Settings()
    assert (settings.uq_fresh_days, settings.uq_max_input_distance, settings.uq_alpha, settings.uq_gate) == \
        (7.0, 4.0, 0.1, "seed")


def test_file_overrides_defaults_and_environment_overrides_file(tmp_path):
    (tmp_path / "settings.yaml").write_text("uq: {fresh_days: 3, gate: strict}\nsolver: {pool_size: 3}\n")
    settings = load_settings(tmp_path, {"OPTIMIZER_SOLVER_POOL_SIZE": "4"})
    assert settings.uq_fresh_days == 3.0 and settings.uq_gate == "strict" and settings.solver_pool_size == 4


@pytest.mark.parametrize("env, message", [
    ({"OPTIMIZER_SOLVER_POOL_SIZE": "5"}, "OPTIMIZER_SOLVER_POOL_SIZE: solver.pool_size must be an integer from 1 to 4"),
    ({"OPTIMIZER_SOLVER_THREADS": "0"}, "solver.threads must be an integer from 1 to 16, got '0'"),
    ({"OPTIMIZER_SOLVER_THREADS": "2.5"}, "solver.threads must be an integer from 1 to 16"),
    ({"OPTIMIZER_SOLVER_CACHE_ENTRIES": "0"}, "solver.cache_entries must be an integer from 1 to 100000, got '0'"),
    ({"OPTIMIZER_UQ_GATE": "loose"}, "uq.gate must be 'seed' or 'strict', got 'loose'"),
    ({"OPTIMIZER_UQ_ALPHA": "1.5"}, "uq.alpha must be a number in (0, 1)"),
    ({"OPTIMIZER_UQ_FRESH_DAYS": "nan"}, "uq.fresh_days must be a number > 0"),
    ({"OPTIMIZER_SCHEDULE_TIMEZONE": "Mars/Olympus"}, "schedule.timezone must be an IANA time zone"),
    ({"OPTIMIZER_SCHEDULE_CRON": "a b c d e"}, "schedule.cron must be a 5-field cron expression"),
    ({"OPTIMIZER_SCHEDULE_CRON": "0 25 * * *"}, "schedule.cron must be a 5-field cron expression"),
    ({"OPTIMIZER_SCHEDULE_CRON": "0 3 * * 8"}, "schedule.cron must be a 5-field cron expression"),
    ({"OPTIMIZER_SCHEDULE_CRON": "*/0 3 * * *"}, "schedule.cron must be a 5-field cron expression"),
    ({"OPTIMIZER_SCHEDULE_CRON": "0 3 * foo *"}, "schedule.cron must be a 5-field cron expression"),
    ({"OPTIMIZER_SCHEDULE_CRON": "0 3 * *"}, "schedule.cron must be a 5-field cron expression"),
    ({"OPTIMIZER_OPCUA_WRITE_ADVICE": "maybe"}, "opcua.write_advice must be true or false, got 'maybe'"),
    ({"OPTIMIZER_OPCUA_ACCEPT_UNCERTAIN": "2"}, "opcua.accept_uncertain must be true or false, got '2'"),
])
def test_bad_environment_setting_is_named(tmp_path, env, message):
    with pytest.raises(SettingsError) as err:
        load_settings(tmp_path, env)
    assert message in str(err.value)


@pytest.mark.parametrize("text, env, expected", [
    ("", {}, (False, False)),  # reading only, Uncertain is missing: the defaults
    ("opcua: {write_advice: true, accept_uncertain: yes}\n", {}, (True, True)),
    ("opcua: {write_advice: true}\n", {"OPTIMIZER_OPCUA_WRITE_ADVICE": "false"}, (False, False)),
    ("", {"OPTIMIZER_OPCUA_WRITE_ADVICE": " True ", "OPTIMIZER_OPCUA_ACCEPT_UNCERTAIN": "1"}, (True, True)),
])
def test_opcua_switches_from_file_and_environment(tmp_path, text, env, expected):
    (tmp_path / "settings.yaml").write_text(text)
    settings = load_settings(tmp_path, env)
    assert (settings.opcua_write_advice, settings.opcua_accept_uncertain) == expected


def test_unknown_key_in_file_is_refused_with_the_closest_and_the_known_ones(tmp_path):
    (tmp_path / "settings.yaml").write_text("uq: {fresh_dayz: 3}\n")
    with pytest.raises(SettingsError, match=r"settings\.yaml: unknown setting 'uq\.fresh_dayz'; did you mean "
                                            r"'uq\.fresh_days'\? \(known: "):
        load_settings(tmp_path, {})


def test_an_unknown_key_close_to_nothing_lists_the_known_ones_without_a_guess(tmp_path):
    (tmp_path / "settings.yaml").write_text("uq: {zzz: 3}\n")
    with pytest.raises(SettingsError, match=r"unknown setting 'uq\.zzz' \(known: "):
        load_settings(tmp_path, {})


def test_malformed_settings_file_is_named(tmp_path):
    (tmp_path / "settings.yaml").write_text("uq: [\n")
    with pytest.raises(SettingsError, match=r"settings\.yaml: not valid YAML"):
        load_settings(tmp_path, {})
    (tmp_path / "settings.yaml").write_text("uq: 3\n")
    with pytest.raises(SettingsError, match=r"section 'uq' must be a mapping"):
        load_settings(tmp_path, {})


def test_every_setting_key_maps_to_a_field():
    from dataclasses import fields

    from optimizer_pipeline.settings import _SPEC

    # opcua.endpoints, a mapping read from the file only, has its own parser (test_opcua_security.py)
    assert {f.name for f in fields(Settings)} == {spec[0] for spec in _SPEC.values()} | {"opcua_endpoints"}


def test_live_max_age_from_file_and_environment_and_its_default_per_binding(tmp_path):
    from optimizer_pipeline.recommend import max_live_age_s

    assert load_settings(tmp_path, {}).live_max_age_s is None
    # unset: ten sample periods, never less than five minutes
    assert [max_live_age_s(None, period) for period in (1, 10, 30, 31, 60)] == [300.0, 300.0, 300.0, 310.0, 600.0]
    (tmp_path / "settings.yaml").write_text("live: {max_age_s: 900}\n")
    assert load_settings(tmp_path, {}).live_max_age_s == 900.0
    settings = load_settings(tmp_path, {"OPTIMIZER_LIVE_MAX_AGE_S": "45.5"})
    assert settings.live_max_age_s == 45.5 and max_live_age_s(settings.live_max_age_s, 60) == 45.5
    with pytest.raises(SettingsError, match=r"OPTIMIZER_LIVE_MAX_AGE_S: live\.max_age_s must be a number > 0"):
        load_settings(tmp_path, {"OPTIMIZER_LIVE_MAX_AGE_S": "0"})


@pytest.mark.parametrize("cron", ["0 3 * * *", "*/15 0-6,22 1 JAN-MAR mon-fri", "0 3 * * 7", "30 2 1,15 */2 0",
                                  "0 22-2 * * *", "0 3 L * *", "0 3 * * 1#2", "5/2 * * * *", "@daily"])
def test_cron_expressions_the_schedule_accepts(tmp_path, cron):
    """Each value within its field (Dagster refuses the rest when it loads the schedule)."""
    from dagster._utils.schedules import is_valid_cron_string

    assert load_settings(tmp_path, {"OPTIMIZER_SCHEDULE_CRON": cron}).schedule_cron == cron
    assert is_valid_cron_string(cron)


def test_a_celery_launcher_without_its_services_names_where_it_was_set(tmp_path):
    with pytest.raises(SettingsError) as err:
        load_settings(tmp_path, {"OPTIMIZER_DAGSTER_RUN_LAUNCHER": "celery"})
    assert str(err.value).startswith("OPTIMIZER_DAGSTER_RUN_LAUNCHER: dagster.run_launcher 'celery' needs")
    (tmp_path / "settings.yaml").write_text("dagster: {run_launcher: celery}\n")
    with pytest.raises(SettingsError) as err:
        load_settings(tmp_path, {})
    assert str(err.value).startswith(f"{tmp_path / 'settings.yaml'}: dagster.run_launcher 'celery' needs")
