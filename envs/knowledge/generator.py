"""A procedural closed-world knowledge base: countries, cities, companies and people with attributes and
relations, written out as one passage per entity.

Names never share a word, so a search for a name finds exactly the passages that mention that entity.
Passages state only an entity's own facts and its *outgoing* relations (a person's passage names their
birthplace and employer; a city's passage names its country). Reaching a fact two relations away therefore
takes two look-ups, which is what makes the number of needed searches of a question known.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rl_llm.envs.knowledge.names import NameMaker
from rl_llm.envs.retrieval.corpus import Passage

OCCUPATIONS = ("architect", "botanist", "cartographer", "chemist", "composer", "engineer", "historian",
               "journalist", "linguist", "mathematician", "painter", "pilot", "physician", "sculptor",
               "surveyor", "teacher")  # fmt: skip
INDUSTRIES = ("shipping", "mining", "software", "textile", "aerospace", "pharmaceutical", "agriculture",
              "banking", "robotics", "publishing")  # fmt: skip
COUNTRY_SUFFIXES = ("ia", "land", "stan", "ar")
CURRENCY_UNITS = ("crown", "mark", "florin", "shell", "talon", "ducat")

# relation -> (from kind, to kind): the links a passage states.
RELATIONS = {
    "birthplace": ("person", "city"),
    "employer": ("person", "company"),
    "headquarters": ("company", "city"),
    "founder": ("company", "person"),
    "country": ("city", "country"),
    "capital": ("country", "city"),
}


@dataclass
class Entity:
    id: str
    kind: str
    name: str
    attrs: dict[str, int | str] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)  # relation -> entity id


@dataclass
class KnowledgeBase:
    seed: int
    entities: dict[str, Entity]

    def of_kind(self, kind: str) -> list[Entity]:
        return [entity for entity in self.entities.values() if entity.kind == kind]

    def linked(self, entity: Entity, relation: str) -> Entity:
        return self.entities[entity.links[relation]]

    def passage(self, entity: Entity) -> Passage:
        return Passage(entity.id, entity.name, _describe(self, entity))

    def passages(self) -> list[Passage]:
        return [self.passage(entity) for entity in self.entities.values()]

    def mentioning(self) -> dict[str, list[str]]:
        """Entity id -> ids of the passages that mention its name (its own and those linking to it)."""
        mentions = {entity_id: [entity_id] for entity_id in self.entities}
        for entity in self.entities.values():
            for target in entity.links.values():
                if entity.id not in mentions[target]:
                    mentions[target].append(entity.id)
        return mentions


def _describe(kb: KnowledgeBase, e: Entity) -> str:
    a, name = e.attrs, e.name
    link = {relation: kb.entities[target].name for relation, target in e.links.items()}
    if e.kind == "person":
        return (f"{name} is a {a['occupation']} who was born in {a['born']} in {link['birthplace']}. "
                f"{name} works for {link['employer']}.")  # fmt: skip
    if e.kind == "company":
        article = "an" if str(a["industry"])[0] in "aeiou" else "a"
        return (f"{name} is {article} {a['industry']} company founded in {a['founded']} by {link['founder']}. "
                f"{name} has its headquarters in {link['headquarters']} and employs {a['employees']:,} people.")  # fmt: skip
    if e.kind == "city":
        return (f"{name} is a city in {link['country']}, founded in {a['founded']}. "
                f"{name} has a population of {a['population']:,}.")  # fmt: skip
    return (f"{name} is a country on the continent of {a['continent']}. The capital of {name} is "
            f"{link['capital']}, and its currency is the {a['currency']}.")  # fmt: skip


def generate_kb(
    seed: int = 0, *, countries: int = 8, cities: int = 40, companies: int = 60, people: int = 160
) -> KnowledgeBase:
    """A knowledge base drawn from ``seed``; the same arguments always give the same entities."""
    if min(countries, cities, companies, people) < 1 or cities < countries:
        raise ValueError("need at least one entity of each kind and at least as many cities as countries")
    rng = np.random.default_rng(seed)
    names = NameMaker(rng)

    def pick(options):  # one uniformly drawn element
        return options[int(rng.integers(len(options)))]

    entities: dict[str, Entity] = {}

    continents = [names.word() for _ in range(4)]
    country_list = [
        Entity(f"country-{i}", "country", names.word(pick(COUNTRY_SUFFIXES)),
               {"continent": pick(continents), "currency": f"{names.word()} {pick(CURRENCY_UNITS)}"})
        for i in range(countries)
    ]  # fmt: skip
    city_list = []
    for i in range(cities):
        country = country_list[i] if i < countries else pick(country_list)  # every country gets a city
        attrs = {"founded": int(rng.integers(800, 1900)), "population": int(rng.integers(10_000, 5_000_000))}
        city_list.append(Entity(f"city-{i}", "city", names.word(), attrs, {"country": country.id}))
    for country in country_list:
        country.links["capital"] = pick([c for c in city_list if c.links["country"] == country.id]).id

    person_list = [
        Entity(f"person-{i}", "person", f"{names.word()} {names.word()}",
               {"occupation": pick(OCCUPATIONS), "born": int(rng.integers(1900, 2000))},
               {"birthplace": pick(city_list).id})
        for i in range(people)
    ]  # fmt: skip
    company_list = []
    for i in range(companies):
        founder = pick(person_list)
        founded = min(int(founder.attrs["born"]) + int(rng.integers(22, 61)), 2023)
        attrs = {"industry": pick(INDUSTRIES), "founded": founded, "employees": int(rng.integers(50, 200_000))}
        company_list.append(
            Entity(f"company-{i}", "company", names.word(), attrs, {"founder": founder.id, "headquarters": pick(city_list).id})
        )
    for person in person_list:
        person.links["employer"] = pick(company_list).id
    for entity in (*country_list, *city_list, *person_list, *company_list):
        entities[entity.id] = entity
    return KnowledgeBase(seed, entities)
