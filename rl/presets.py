"""Agent presets as hydra options.

`register_agent(name, Config, presets_file)` (called for every agent by `agents.register`, which the process's
set-up step agents.setup.setup runs) stores hydra's `agent=<name>` and `agent=<name>_<preset>` options, each a
whole agent section: the `Config` dataclass's defaults < the preset (agents/<name>.yaml) < the command line's
keys. The preset of `agent=<name>` is the one the agent's yaml names for the env's `family` (configs/env/*.yaml,
`env_families`).
"""

from __future__ import annotations

from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rl.config import CONFIG_DIR, ENV_FAMILIES, ConfigError, to_dataclass


def env_families(config_dir: Path = CONFIG_DIR) -> dict[str, str]:
    """`env=<choice>` -> the family its yaml declares (`family:`), for every configs/env/**/*.yaml. A missing or
    unknown family is a `ConfigError` naming the file."""
    root = config_dir / "env"
    out = {}
    for path in sorted(root.rglob("*.yaml")):
        family = OmegaConf.load(path).get("family")
        if family not in ENV_FAMILIES:
            raise ConfigError(f"{path}: `family` must be one of {', '.join(ENV_FAMILIES)} (it picks each agent's "
                              f"preset), got {family!r}")
        out[path.relative_to(root).with_suffix("").as_posix()] = family
    return out


def fold_lr(section: dict) -> dict:
    """An agent section (plain dict) with the shared `lr` key moved into `optim.lr` where `optim` has none:
    the one place `agent.lr` is read (`_defaults` makes `optim.lr` follow it in a composed config)."""
    if "lr" not in section:
        return section
    section = dict(section)
    lr, optim = section.pop("lr"), dict(section.get("optim") or {})
    section["optim"] = {"lr": lr, **optim}
    return section


def _defaults(schema: type) -> DictConfig:
    """Every key of the agent `Config` dataclass `schema` at its default, plus the shared `lr` key where it has
    `optim.lr` (`optim.lr: ${..lr}` follows it, so `agent.lr=...` sweeps any agent); struct, so a preset's
    unknown key is refused when merged over it."""
    base = OmegaConf.to_container(OmegaConf.structured(schema))
    optim = base.get("optim")
    if isinstance(optim, dict) and "lr" in optim:
        base = {"lr": optim["lr"], **base, "optim": {**optim, "lr": "${..lr}"}}
    node = OmegaConf.create(base)
    OmegaConf.set_struct(node, True)
    return node


def _parts(presets: dict, name: str, where: str, seen: tuple[str, ...] = ()) -> list[dict]:
    """The key mappings preset `name` merges, in order (a list item naming a preset brings that preset's)."""
    if name not in presets:
        raise ConfigError(f"{where}: no preset {name!r}; its presets: {', '.join(sorted(presets)) or 'none'}")
    if name in seen:
        raise ConfigError(f"{where}: preset {name!r} includes itself ({' -> '.join([*seen, name])})")
    out = []
    for part in presets[name] if isinstance(presets[name], list) else [presets[name]]:
        if isinstance(part, str):
            out += _parts(presets, part, where, (*seen, name))
        elif isinstance(part, dict):
            out.append(part)
        else:
            raise ConfigError(f"{where}: preset {name!r} must be a mapping of keys or a list of preset names and "
                              f"mappings, got {part!r}")
    return out


def agent_presets(schema: type, presets_file: Path) -> tuple[dict[str, DictConfig], dict[str, str], DictConfig]:
    """`(preset -> agent section, family -> preset, defaults section)` of the agent whose `Config` dataclass is
    `schema` and whose presets are in `presets_file` (absent: no presets). The file holds `families: {family:
    preset}` and `presets: {name: keys | [preset names and keys, merged in order]}`, keys being those that
    differ from the defaults; a family it does not name takes the defaults. Each section is every key
    (`_defaults`) with the preset's merged over them, checked by `schema` (`ConfigError` naming the file)."""
    where = str(presets_file)
    data = OmegaConf.to_container(OmegaConf.load(presets_file)) if presets_file.exists() else {}
    if not isinstance(data, dict) or set(data) - {"families", "presets"}:
        got = sorted(data) if isinstance(data, dict) else data
        raise ConfigError(f"{where}: holds `families` and `presets` only, got {got!r}")
    presets, families = data.get("presets") or {}, data.get("families") or {}
    for family, preset in families.items():
        if family not in ENV_FAMILIES:
            raise ConfigError(f"{where}: families.{family}: not an env family; env families: "
                              f"{', '.join(ENV_FAMILIES)}")
        _parts(presets, preset, f"{where}: families.{family}")
    defaults, sections = _defaults(schema), {}
    for name in presets:
        if not str(name).isidentifier():
            raise ConfigError(f"{where}: preset name {name!r} must be an identifier (agent=<agent>_<preset>)")
        try:
            section = OmegaConf.merge(defaults, *_parts(presets, name, where))
        except OmegaConfBaseException as e:
            raise ConfigError(f"{where}: preset {name!r}: {str(e).strip().splitlines()[0]}") from None
        try:
            to_dataclass(schema, fold_lr(OmegaConf.to_container(section, resolve=True)), "agent")
        except ConfigError as e:
            raise ConfigError(f"{where}: preset {name!r}: {e}") from None
        sections[name] = section
    for section in [*sections.values(), defaults]:  # stored without the flag: hydra's own struct mode refuses
        OmegaConf.set_struct(section, None)          # unknown keys, and open_dict can still edit a composed config
    return sections, dict(families), defaults


def register_agent(name: str, schema: type, presets_file: Path,
                   families: dict[str, str] | None = None) -> list[str]:
    """Store agent `name`'s options in hydra's ConfigStore and return their names: `agent=<name>_<preset>` for
    every preset of `presets_file` (on any env), and `agent=<name>`, which takes the preset `families` names for
    the env's family: one `_agent_by_env/<name>/<env>` node per env config (`families`: env -> family, read from
    configs/env by default), chosen through the defaults list's `${env}`, naming its family's
    `_agent_by_family/<name>/<family>` section (each section is stored once per family, not once per env:
    storing copies it, in every process). Each section is a whole agent section (`agent_presets`), so hydra
    refuses unknown keys and the composed config shows every effective key."""
    sections, by_family, defaults = agent_presets(schema, presets_file)
    store = ConfigStore.instance()
    for preset, section in sections.items():
        store.store(group="agent", name=f"{name}_{preset}", node=section)
    for family in ENV_FAMILIES:
        section = sections[by_family[family]] if family in by_family else defaults
        store.store(group=f"_agent_by_family/{name}", name=family, node=section)
    for env, family in (env_families() if families is None else families).items():
        group, _, option = f"_agent_by_env/{name}/{env}".rpartition("/")
        store.store(group=group, name=option, node={"defaults": [{f"/_agent_by_family/{name}@_here_": family}]})
    store.store(group="agent", name=name, node={"defaults": [{f"/_agent_by_env/{name}@_here_": "${env}"}]})
    return [name, *(f"{name}_{preset}" for preset in sections)]
