"""Procedural Text2SQL data: seeded SQLite databases in several domains, template questions and gold SQL.

Every domain has the same shape under its own names: a *group* table (departments, stores, ...), an
*entity* table belonging to a group (students, customers, ...) with a category and a numeric measure, an
*item* table (courses, products, ...) and a *link* table between entities and items with a quantity. The
templates cover filters, joins over two and three tables, aggregation, GROUP BY/HAVING, nested queries
(scalar subqueries, NOT IN), ORDER BY and LIMIT. Measures are distinct within a table and a template whose
answer depends on a tie is skipped, so every gold answer is unambiguous; templates whose gold result is
empty are skipped too.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_llm.envs.sql.database import QueryLimits, QueryResult, ReadOnlyDatabase
from rl_llm.envs.sql.tasks import SqlTask
from rl_llm.paths import atomic_path, cache_dir

_CHECK_LIMITS = QueryLimits(timeout_s=10.0)
# Bump when generated data changes, so cached files of an older version are not reused.
GENERATOR_VERSION = 1

FIRST_NAMES = ("Ada", "Ben", "Chloe", "Dev", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kemi", "Liam",
               "Maya", "Noor", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tara", "Uma", "Victor", "Wen", "Yusuf")
LAST_NAMES = ("Adler", "Brooks", "Costa", "Diaz", "Eriksen", "Fischer", "Gupta", "Haddad", "Ito", "Jensen",
              "Kowalski", "Lopez", "Moreau", "Nakamura", "Okafor", "Petrov", "Rossi", "Silva", "Tanaka", "Weber")
WORDS = ("Amber", "Blue", "Cedar", "Delta", "Echo", "Falcon", "Granite", "Harbor", "Iris", "Juniper", "Kestrel",
         "Lumen", "Maple", "Nova", "Orchid", "Pine", "Quartz", "River", "Summit", "Tide", "Umber", "Vale")  # fmt: skip


@dataclass(frozen=True)
class Measure:
    column: str
    label: str
    low: float
    high: float
    decimals: int = 0

    def draw(self, rng: random.Random, count: int) -> list[float | int]:
        """``count`` distinct values (distinct so orderings and maxima have no ties)."""
        scale = 10**self.decimals
        picks = rng.sample(range(int(self.low * scale), int(self.high * scale) + 1), count)
        return [p / scale if self.decimals else p for p in picks]


@dataclass(frozen=True)
class Domain:
    name: str
    group: str
    groups: str
    group_attr: tuple[str, tuple[str, ...]]
    entity: str
    entities: str
    category: tuple[str, str, tuple[str, ...]]  # column, label, values
    measure: Measure
    item: str
    items: str
    item_category: tuple[str, str, tuple[str, ...]]
    item_measure: Measure
    link: str
    links: str
    quantity: Measure


DOMAINS: tuple[Domain, ...] = (
    Domain("school", "department", "departments", ("building", ("North Hall", "South Hall", "Annex", "Tower")),
           "student", "students", ("year", "year", ("freshman", "sophomore", "junior", "senior")),
           Measure("gpa", "GPA", 2.0, 4.0, 2), "course", "courses",
           ("subject", "subject", ("math", "physics", "history", "art", "biology")),
           Measure("credits", "credits", 1, 60), "enrollment", "enrollments", Measure("score", "score", 40, 100)),
    Domain("retail", "store", "stores", ("city", ("Lisbon", "Oslo", "Lagos", "Osaka", "Quito")),
           "customer", "customers", ("tier", "tier", ("bronze", "silver", "gold")),
           Measure("loyalty_points", "loyalty points", 0, 9000), "product", "products",
           ("category", "category", ("books", "garden", "kitchen", "toys", "sports")),
           Measure("price", "price", 1, 500, 2), "purchase", "purchases", Measure("quantity", "quantity", 1, 9)),
    Domain("library", "branch", "branches", ("district", ("Old Town", "Riverside", "Hillcrest", "Harbor")),
           "member", "members", ("membership", "membership type", ("standard", "student", "senior")),
           Measure("reading_minutes", "reading minutes", 100, 20000), "book", "books",
           ("genre", "genre", ("mystery", "poetry", "science", "fantasy", "travel")),
           Measure("pages", "page count", 60, 900), "loan", "loans", Measure("days", "loan days", 1, 30)),
    Domain("company", "division", "divisions", ("floor", ("1", "2", "3", "4", "5")),
           "employee", "employees", ("role", "role", ("engineer", "analyst", "designer", "manager")),
           Measure("salary", "salary", 30000, 150000), "project", "projects",
           ("area", "area", ("research", "sales", "operations", "security")),
           Measure("budget", "budget", 10000, 900000), "assignment", "assignments",
           Measure("hours", "hours", 1, 60)),
)  # fmt: skip


@dataclass
class GeneratedDatabase:
    """The rows of one generated database (kept in memory to pick template parameters)."""

    domain: Domain
    groups: list[tuple[Any, ...]]
    entities: list[tuple[Any, ...]]  # id, name, group id, category, measure
    items: list[tuple[Any, ...]]  # id, name, category, measure
    links: list[tuple[Any, ...]]  # entity id, item id, quantity


def _unique_names(rng: random.Random, count: int, make: Callable[[], str]) -> list[str]:
    names: list[str] = []
    seen: set[str] = set()
    while len(names) < count:
        name = make()
        if name not in seen:
            seen.add(name)
            names.append(name)
    return names


def generate_rows(domain: Domain, seed: int) -> GeneratedDatabase:
    rng = random.Random(f"{domain.name}-{seed}")
    group_names = _unique_names(rng, rng.randint(4, 6), lambda: f"{rng.choice(WORDS)} {domain.group.title()}")
    groups = [(i + 1, name, rng.choice(domain.group_attr[1])) for i, name in enumerate(group_names)]
    entity_count = rng.randint(30, 60)
    people = _unique_names(rng, entity_count, lambda: f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}")
    measures = domain.measure.draw(rng, entity_count)
    entities = [
        (i + 1, people[i], rng.randint(1, len(groups)), rng.choice(domain.category[2]), measures[i])
        for i in range(entity_count)
    ]
    item_count = rng.randint(10, 20)
    titles = _unique_names(rng, item_count, lambda: f"{rng.choice(WORDS)} {rng.choice(WORDS)}")
    item_measures = domain.item_measure.draw(rng, item_count)
    items = [(i + 1, titles[i], rng.choice(domain.item_category[2]), item_measures[i]) for i in range(item_count)]
    links = []
    for entity_id, *_ in entities:
        if rng.random() < 0.15:  # some entities have no links, for the NOT IN template
            continue
        for item_id in rng.sample(range(1, item_count + 1), rng.randint(1, 4)):
            links.append((entity_id, item_id, rng.randint(int(domain.quantity.low), int(domain.quantity.high))))
    return GeneratedDatabase(domain, groups, entities, items, links)


def _schema(d: Domain) -> str:
    g, e, i, m, q = d.group, d.entity, d.item, d.measure, d.quantity
    number = {0: "INTEGER"}
    return f"""
CREATE TABLE {g} ({g}_id INTEGER PRIMARY KEY, name TEXT NOT NULL, {d.group_attr[0]} TEXT);
CREATE TABLE {e} ({e}_id INTEGER PRIMARY KEY, name TEXT NOT NULL, {g}_id INTEGER NOT NULL REFERENCES {g} ({g}_id),
    {d.category[0]} TEXT NOT NULL, {m.column} {number.get(m.decimals, "REAL")} NOT NULL);
CREATE TABLE {i} ({i}_id INTEGER PRIMARY KEY, name TEXT NOT NULL, {d.item_category[0]} TEXT NOT NULL,
    {d.item_measure.column} {number.get(d.item_measure.decimals, "REAL")} NOT NULL);
CREATE TABLE {d.link} ({e}_id INTEGER NOT NULL REFERENCES {e} ({e}_id),
    {i}_id INTEGER NOT NULL REFERENCES {i} ({i}_id), {q.column} INTEGER NOT NULL, PRIMARY KEY ({e}_id, {i}_id));
"""


def write_database(data: GeneratedDatabase, path: Path) -> None:
    """Write the rows to ``path`` atomically (a temp file renamed into place)."""
    d = data.domain
    with atomic_path(path) as partial:
        connection = sqlite3.connect(partial)
        try:
            connection.executescript(_schema(d))
            for table, rows in ((d.group, data.groups), (d.entity, data.entities), (d.item, data.items),
                                (d.link, data.links)):  # fmt: skip
                marks = ", ".join("?" * len(rows[0]))
                connection.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)
            connection.commit()
        finally:
            connection.close()


# A template returns (question, gold SQL, tie check) or None; the tie check is a query whose first column
# lists the sort keys in order, with the rank ``k`` the answer cuts at: the keys at k-1 and k must differ.
Made = tuple[str, str, "tuple[str, int] | None"]
Template = Callable[[GeneratedDatabase, random.Random], "Made | None"]


def _count_by_category(db: GeneratedDatabase, rng: random.Random) -> tuple[str, str, None]:
    d = db.domain
    value = rng.choice(sorted({row[3] for row in db.entities}))
    return (f"How many {d.entities} have {d.category[1]} '{value}'?",
            f"SELECT COUNT(*) FROM {d.entity} WHERE {d.category[0]} = '{value}'", None)  # fmt: skip


def _filter_ordered(db: GeneratedDatabase, rng: random.Random) -> tuple[str, str, None]:
    d, m = db.domain, db.domain.measure
    threshold = sorted(row[4] for row in db.entities)[int(len(db.entities) * rng.uniform(0.6, 0.85))]
    return (f"List the names of the {d.entities} whose {m.label} is greater than {threshold}, "
            f"from the highest {m.label} to the lowest.",
            f"SELECT name FROM {d.entity} WHERE {m.column} > {threshold} ORDER BY {m.column} DESC", None)  # fmt: skip


def _average_per_group(db: GeneratedDatabase, rng: random.Random) -> tuple[str, str, None]:
    d = db.domain
    return (f"For each {d.group} that has {d.entities}, give its name and the average {d.measure.label} "
            f"of its {d.entities}.",
            f"SELECT g.name, AVG(e.{d.measure.column}) FROM {d.group} AS g JOIN {d.entity} AS e "
            f"ON e.{d.group}_id = g.{d.group}_id GROUP BY g.{d.group}_id", None)  # fmt: skip


def _largest_group(db: GeneratedDatabase, rng: random.Random) -> tuple[str, str, tuple[str, int]]:
    d = db.domain
    joined = f"FROM {d.group} AS g JOIN {d.entity} AS e ON e.{d.group}_id = g.{d.group}_id GROUP BY g.{d.group}_id"
    return (f"Which {d.group} has the most {d.entities}? Give its name.",
            f"SELECT g.name {joined} ORDER BY COUNT(*) DESC LIMIT 1",
            (f"SELECT COUNT(*) {joined} ORDER BY COUNT(*) DESC", 1))  # fmt: skip


def _above_average(db: GeneratedDatabase, rng: random.Random) -> tuple[str, str, None]:
    d, m = db.domain, db.domain.measure
    return (f"Which {d.entities} have a {m.label} above the average {m.label} of all {d.entities}? "
            "Give their names.",
            f"SELECT name FROM {d.entity} WHERE {m.column} > (SELECT AVG({m.column}) FROM {d.entity})", None)  # fmt: skip


def _members_of_group(db: GeneratedDatabase, rng: random.Random) -> tuple[str, str, None]:
    d = db.domain
    name = rng.choice(sorted({db.groups[row[2] - 1][1] for row in db.entities}))
    return (f"What are the names of the {d.entities} of the {d.group} called '{name}'?",
            f"SELECT e.name FROM {d.entity} AS e JOIN {d.group} AS g ON e.{d.group}_id = g.{d.group}_id "
            f"WHERE g.name = '{name}'", None)  # fmt: skip


def _distinct_item_categories(db: GeneratedDatabase, rng: random.Random) -> tuple[str, str, None]:
    d, column = db.domain, db.domain.item_category[0]
    return (f"How many different {d.item_category[1]} values do the {d.items} have?",
            f"SELECT COUNT(DISTINCT {column}) FROM {d.item}", None)  # fmt: skip


def _groups_having(db: GeneratedDatabase, rng: random.Random) -> tuple[str, str, None]:
    d = db.domain
    sizes = sorted(sum(1 for row in db.entities if row[2] == group[0]) for group in db.groups)
    limit = sizes[len(sizes) // 2]
    return (f"Which {d.groups} have more than {limit} {d.entities}? Give their names.",
            f"SELECT g.name FROM {d.group} AS g JOIN {d.entity} AS e ON e.{d.group}_id = g.{d.group}_id "
            f"GROUP BY g.{d.group}_id HAVING COUNT(*) > {limit}", None)  # fmt: skip


def _top_three(db: GeneratedDatabase, rng: random.Random) -> tuple[str, str, None]:
    d, m = db.domain, db.domain.measure
    return (f"What are the names of the three {d.entities} with the highest {m.label}, highest first?",
            f"SELECT name FROM {d.entity} ORDER BY {m.column} DESC LIMIT 3", None)  # fmt: skip


def _links_per_item_category(db: GeneratedDatabase, rng: random.Random) -> tuple[str, str, None]:
    d, column = db.domain, db.domain.item_category[0]
    return (f"For each {d.item_category[1]} of {d.items}, how many {d.links} are there?",
            f"SELECT i.{column}, COUNT(*) FROM {d.link} AS l JOIN {d.item} AS i ON l.{d.item}_id = i.{d.item}_id "
            f"GROUP BY i.{column}", None)  # fmt: skip


def _without_links(db: GeneratedDatabase, rng: random.Random) -> tuple[str, str, None]:
    d = db.domain
    return (f"Which {d.entities} have no {d.links}? Give their names.",
            f"SELECT name FROM {d.entity} WHERE {d.entity}_id NOT IN (SELECT {d.entity}_id FROM {d.link})", None)  # fmt: skip


def _max_per_category(db: GeneratedDatabase, rng: random.Random) -> tuple[str, str, None]:
    d = db.domain
    return (f"What is the highest {d.measure.label} for each {d.category[1]}? Give the {d.category[1]} "
            f"and the value.",
            f"SELECT {d.category[0]}, MAX({d.measure.column}) FROM {d.entity} GROUP BY {d.category[0]}", None)  # fmt: skip


def _group_of_best(db: GeneratedDatabase, rng: random.Random) -> tuple[str, str, None]:
    d, m = db.domain, db.domain.measure
    return (f"Which {d.group} does the {d.entity} with the highest {m.label} belong to? Give its name.",
            f"SELECT g.name FROM {d.group} AS g JOIN {d.entity} AS e ON e.{d.group}_id = g.{d.group}_id "
            f"WHERE e.{m.column} = (SELECT MAX({m.column}) FROM {d.entity})", None)  # fmt: skip


def _items_of_entity(db: GeneratedDatabase, rng: random.Random) -> tuple[str, str, None]:
    d = db.domain
    linked = sorted({row[0] for row in db.links})
    name = db.entities[rng.choice(linked) - 1][1]
    return (f"Give the names of the {d.items} in the {d.links} of the {d.entity} named '{name}'.",
            f"SELECT i.name FROM {d.item} AS i JOIN {d.link} AS l ON l.{d.item}_id = i.{d.item}_id "
            f"JOIN {d.entity} AS e ON e.{d.entity}_id = l.{d.entity}_id WHERE e.name = '{name}'", None)  # fmt: skip


def _total_quantity_ranked(db: GeneratedDatabase, rng: random.Random) -> tuple[str, str, tuple[str, int]]:
    d, q = db.domain, db.domain.quantity
    joined = (f"FROM {d.group} AS g JOIN {d.entity} AS e ON e.{d.group}_id = g.{d.group}_id "
              f"JOIN {d.link} AS l ON l.{d.entity}_id = e.{d.entity}_id GROUP BY g.{d.group}_id")  # fmt: skip
    return (f"Which two {d.groups} have the largest total {q.label} over their {d.entities}' {d.links}? "
            f"Give each name and total, largest first.",
            f"SELECT g.name, SUM(l.{q.column}) {joined} ORDER BY SUM(l.{q.column}) DESC LIMIT 2",
            (f"SELECT SUM(l.{q.column}) {joined} ORDER BY 1 DESC", 2))  # fmt: skip


TEMPLATES: tuple[Template, ...] = (
    _count_by_category, _filter_ordered, _average_per_group, _largest_group, _above_average, _members_of_group,
    _distinct_item_categories, _groups_having, _top_three, _links_per_item_category, _without_links,
    _max_per_category, _group_of_best, _items_of_entity, _total_quantity_ranked,
)  # fmt: skip


def _unambiguous(database: ReadOnlyDatabase, gold_sql: str, tie_check: tuple[str, int] | None) -> bool:
    gold = database.execute(gold_sql, _CHECK_LIMITS)
    if not gold.ok or not gold.rows:
        raise_if_broken(gold, gold_sql)
        return False
    if tie_check is None:
        return True
    sql, rank = tie_check
    keys = [row[0] for row in database.execute(sql, _CHECK_LIMITS).rows]
    return len(keys) <= rank or keys[rank - 1] != keys[rank]


def raise_if_broken(result: QueryResult, sql: str) -> None:
    """A template's SQL that fails is a bug in the template, not an empty answer."""
    if not result.ok:
        raise RuntimeError(f"generated gold SQL failed: {result.error}\n{sql}")


def generate_tasks(num_databases: int, seed: int = 0, directory: str | Path | None = None) -> list[SqlTask]:
    """Tasks on ``num_databases`` generated databases (domains in turn), written under ``directory``.

    Databases of one domain share their question templates and often their drawn values, so the same
    question text comes up on several databases; it is kept on the first only (a training set must not count
    one question twice, and a policy cannot tell the copies apart by their text).

    The default directory, ``sql-generated`` in rl-llm's cache folder (``rl_llm.paths.cache_dir``), is shared
    by the user's processes (files are written atomically and are the same for the same seed), so parallel
    environments do not rebuild the same databases.
    """
    if num_databases < 1:
        raise ValueError(f"num_databases must be at least 1, got {num_databases}")
    root = Path(directory) if directory is not None else cache_dir() / "sql-generated"
    tasks: list[SqlTask] = []
    asked: set[str] = set()
    for number in range(num_databases):
        domain = DOMAINS[number % len(DOMAINS)]
        db_seed = seed * 100_003 + number
        data = generate_rows(domain, db_seed)
        db_id = f"{domain.name}_{db_seed}"
        path = root / f"v{GENERATOR_VERSION}_{db_id}.sqlite"
        if not path.is_file():
            write_database(data, path)
        rng = random.Random(f"questions-{db_id}")
        with ReadOnlyDatabase(path) as database:
            for template in TEMPLATES:
                made = template(data, rng)
                if made is None or not _unambiguous(database, made[1], made[2]):
                    continue
                question, sql, _ = made
                if question in asked:  # the same question on another database of the domain: asked once
                    continue
                asked.add(question)
                tasks.append(SqlTask(f"{db_id}-{template.__name__.strip('_')}", db_id, path, question, sql,
                                     difficulty="generated"))  # fmt: skip
    return tasks
