"""Family ``config``: crontabs, INI files, environment files and service units."""

from __future__ import annotations

import json
import random

from rl_llm.envs.terminal.families.common import WHERE, WORDS, Draft, pick, python_cmd, q, write_file_cmd

DAYS = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")


def _cron_job(rng: random.Random, script: str) -> tuple[str, list[str]]:
    """(English schedule, cron fields) for one job."""
    kind = rng.randrange(5)
    minute, hour = rng.randrange(60), rng.randrange(24)
    if kind == 0:
        return f"every day at {hour:02d}:{minute:02d}", [str(minute), str(hour), "*", "*", "*"]
    if kind == 1:
        step = rng.choice((5, 10, 15, 20, 30))
        return f"every {step} minutes", [f"*/{step}", "*", "*", "*", "*"]
    if kind == 2:
        day = rng.randrange(7)
        return f"every {DAYS[day]} at {hour:02d}:{minute:02d}", [str(minute), str(hour), "*", "*", str(day)]
    if kind == 3:
        dom = rng.randint(1, 28)
        return f"on day {dom} of every month at {hour:02d}:{minute:02d}", [str(minute), str(hour), str(dom), "*", "*"]
    return (f"at minute {minute} of every hour from {hour % 12}:00 to {hour % 12 + 8}:59 on weekdays (Monday to Friday)",
            [str(minute), f"{hour % 12}-{hour % 12 + 8}", "*", "*", "1-5"])


def crontab(rng: random.Random, difficulty: int) -> Draft:
    scripts = [f"/home/user/bin/{w}.sh" for w in pick(rng, WORDS, 1 + difficulty)]
    jobs = [(script, *_cron_job(rng, script)) for script in scripts]
    listing = "; ".join(f"run `{script}` {when}" for script, when, _ in jobs)
    lines = [" ".join(fields) + " " + script for script, _, fields in jobs]
    return Draft(
        description=(
            f"Write a crontab file `crontab.txt` (standard five-field cron syntax, one job per line, no user "
            f"column) with exactly these jobs: {listing}. {WHERE}"
        ),
        files={},
        checks=[{"kind": "cron", "path": "crontab.txt", "expected": [[*fields, s] for s, _, fields in jobs]}],
        solution=[write_file_cmd("crontab.txt", "\n".join(lines) + "\n")],
    )


def _ini(sections: dict[str, dict[str, str]], comments: bool) -> str:
    out = []
    for name, values in sections.items():
        if comments:
            out.append(f"; settings for {name}")
        out.append(f"[{name}]")
        out.extend(f"{key} = {value}" for key, value in values.items())
        out.append("")
    return "\n".join(out)


def edit_ini(rng: random.Random, difficulty: int) -> Draft:
    names = pick(rng, ("server", "database", "logging", "cache", "auth", "mail"), 3)
    sections = {
        name: {key: rng.choice((str(rng.randint(1, 9000)), rng.choice(WORDS))) for key in pick(rng, WORDS, 3)}
        for name in names
    }
    expected = {name: dict(values) for name, values in sections.items()}
    changes, changed = [], set()
    for name in rng.sample(names, min(difficulty, 2)):
        key = rng.choice(list(sections[name]))
        changed.add((name, key))
        value = rng.choice(WORDS) + str(rng.randint(1, 99))
        expected[name][key] = value
        changes.append(f"set `{key}` in section `[{name}]` to `{value}`")
    new_section, new_key, new_value = "feature_" + rng.choice(WORDS), rng.choice(WORDS), str(rng.randint(1, 999))
    expected[new_section] = {new_key: new_value}
    changes.append(f"add a new section `[{new_section}]` with `{new_key} = {new_value}`")
    if difficulty >= 3:
        doomed_section = rng.choice(names)
        doomed = rng.choice([k for k in sections[doomed_section] if (doomed_section, k) not in changed])
        del expected[doomed_section][doomed]
        changes.append(f"remove the key `{doomed}` from `[{doomed_section}]`")
    program = (
        "import configparser, json; c = configparser.ConfigParser(interpolation=None); c.optionxform = str; "
        "c.read('app/config.ini'); c.read_dict(json.loads(__import__('sys').argv[1])); "
        + "".join(f"c.remove_option({s!r}, {k!r}); " for s in sections for k in sections[s] if k not in expected[s])
        + "c.write(open('app/config.ini', 'w'))"
    )
    return Draft(
        description=(
            f"Edit the INI file `app/config.ini`: {'; '.join(changes)}. Keep every other setting as it is. {WHERE}"
        ),
        files={"app/config.ini": _ini(sections, comments=difficulty >= 2)},
        checks=[{"kind": "ini", "path": "app/config.ini", "expected": expected}],
        solution=[python_cmd(program) + " " + q(json.dumps(expected))],
    )


def edit_env_file(rng: random.Random, difficulty: int) -> Draft:
    keys = [w.upper() + "_" + rng.choice(("URL", "PORT", "MODE", "USER", "TIMEOUT")) for w in pick(rng, WORDS, 4 + difficulty)]
    values = {key: rng.choice((str(rng.randint(1, 65535)), rng.choice(WORDS), f"http://{rng.choice(WORDS)}.local"))
              for key in keys}
    lines = ["# service environment"] + [f"{k}={v}" for k, v in values.items()]
    expected = dict(values)
    changed, removed = keys[0], keys[1] if difficulty >= 2 else None
    expected[changed] = rng.choice(WORDS) + "-" + str(rng.randint(1, 99))
    added = rng.choice(WORDS).upper() + "_ENABLED"
    expected[added] = rng.choice(("true", "false"))
    tasks = [f"set `{changed}` to `{expected[changed]}`", f"add `{added}={expected[added]}`"]
    commands = f"sed -i 's|^{changed}=.*|{changed}={expected[changed]}|' service.env"
    if removed:
        del expected[removed]
        tasks.insert(1, f"remove `{removed}` entirely")
        commands += f" && sed -i '/^{removed}=/d' service.env"
    return Draft(
        description=(
            f"`service.env` is an environment file with `KEY=value` lines. In it, {'; '.join(tasks)}. "
            f"Keep the other variables unchanged. {WHERE}"
        ),
        files={"service.env": "\n".join(lines) + "\n"},
        checks=[{"kind": "env_file", "path": "service.env", "expected": expected}],
        solution=[commands + f" && echo '{added}={expected[added]}' >> service.env"],
    )


def service_unit(rng: random.Random, difficulty: int) -> Draft:
    name = rng.choice(WORDS) + "-" + rng.choice(("worker", "api", "sync", "indexer"))
    binary = f"/opt/{name}/bin/{name.split('-')[0]}"
    port = rng.randint(1024, 65000)
    restart = rng.choice(("on-failure", "always"))
    expected = {
        "Unit": {"Description": f"{name} service"},
        "Service": {"ExecStart": f"{binary} --port {port}", "Restart": restart},
        "Install": {"WantedBy": "default.target"},
    }
    wants = [f"`Description={name} service` in `[Unit]`", f"`ExecStart={binary} --port {port}`",
             f"`Restart={restart}` in `[Service]`", "`WantedBy=default.target` in `[Install]`"]
    if difficulty >= 2:
        expected["Service"]["Environment"] = f"LOG_LEVEL={rng.choice(('debug', 'info', 'warning'))}"
        wants.insert(3, f"`Environment={expected['Service']['Environment']}`")
    if difficulty >= 3:
        expected["Service"]["RestartSec"] = str(rng.randint(2, 30))
        expected["Unit"]["After"] = "network.target"
        wants += [f"`RestartSec={expected['Service']['RestartSec']}`", "`After=network.target` in `[Unit]`"]
    unit = "".join(f"[{section}]\n" + "".join(f"{k}={v}\n" for k, v in values.items()) + "\n"
                   for section, values in expected.items())
    path = f".config/systemd/user/{name}.service"
    return Draft(
        description=(
            f"Create the systemd user unit `~/{path}` with exactly these settings (no others): "
            f"{', '.join(wants)}. {WHERE}"
        ),
        files={},
        checks=[{"kind": "ini", "path": path, "expected": expected}],
        solution=[write_file_cmd(path, unit)],
    )


VARIANTS = {
    "crontab": crontab,
    "edit_ini": edit_ini,
    "edit_env_file": edit_env_file,
    "service_unit": service_unit,
}
