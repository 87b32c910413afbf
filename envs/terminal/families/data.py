"""Family ``data``: CSV and JSON processing (aggregation, filtering, conversion)."""

from __future__ import annotations

import csv
import io
import json
import random
from collections import defaultdict

from rl_llm.envs.terminal.families.common import (
    CITIES,
    FIRST_NAMES,
    LAST_NAMES,
    WHERE,
    WORDS,
    Draft,
    pick,
    python_cmd,
)

REGIONS = ("north", "south", "east", "west", "central")


def _csv(rows: list[list]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows)
    return buffer.getvalue()


def _product(rng: random.Random, difficulty: int) -> str:
    name = f"{rng.choice(WORDS)} {rng.choice(('lamp', 'chair', 'mug', 'desk', 'kettle', 'shelf'))}"
    if difficulty >= 3 and rng.random() < 0.4:
        name += f", {rng.choice(('large', 'small', 'blue', 'set of 2'))}"  # a comma inside a quoted field
    return name


def revenue_by_region(rng: random.Random, difficulty: int) -> Draft:
    regions = pick(rng, REGIONS, 2 + difficulty)
    rows = [["order_id", "date", "region", "product", "quantity", "unit_price"]]
    for order in range(1, 12 + 10 * difficulty):
        rows.append([order, f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}", rng.choice(regions),
                     _product(rng, difficulty), rng.randint(1, 9), f"{rng.randint(100, 9999) / 100:.2f}"])
    totals: dict[str, float] = defaultdict(float)
    for row in rows[1:]:
        totals[row[2]] += row[4] * float(row[5])
    expected = {region: round(total, 2) for region, total in sorted(totals.items())}
    program = (
        "import csv, json, collections; t = collections.defaultdict(float)\n"
        "for r in csv.DictReader(open('sales.csv')): t[r['region']] += int(r['quantity']) * float(r['unit_price'])\n"
        "json.dump({k: round(v, 2) for k, v in sorted(t.items())}, open('region_totals.json', 'w'))"
    )
    return Draft(
        description=(
            "`sales.csv` lists orders (with a header row). Compute the revenue (quantity times unit_price) per "
            "region and write `region_totals.json`: one JSON object mapping each region that appears to its "
            f"total revenue as a number rounded to 2 decimals. {WHERE}"
        ),
        files={"sales.csv": _csv(rows)},
        checks=[{"kind": "file_text", "path": "region_totals.json", "expected": json.dumps(expected),
                 "mode": "json", "tol": 0.011}],
        solution=[python_cmd(program)],
    )


def _people(rng: random.Random, count: int) -> list[dict]:
    people = []
    for index in range(count):
        first, last = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)
        people.append({
            "id": 100 + index * rng.randint(1, 3) + index, "name": f"{first} {last}",
            "email": f"{first.lower()}.{last.lower()}{index}@example.com", "age": rng.randint(18, 70),
            "active": rng.random() < 0.6, "city": rng.choice(CITIES),
        })
    rng.shuffle(people)
    return people


def json_to_csv(rng: random.Random, difficulty: int) -> Draft:
    people = _people(rng, 8 + 6 * difficulty)
    min_age = rng.randint(25, 45)
    chosen = sorted((p for p in people if p["active"] and p["age"] > min_age), key=lambda p: p["id"])
    if not chosen:
        people[0].update(active=True, age=min_age + 5)
        chosen = [people[0]]
    columns = ["id", "name", "email"] + (["city"] if difficulty >= 2 else [])
    expected = _csv([columns] + [[p[c] for c in columns] for p in chosen])
    data = {"generated": "2024-01-01", "users": people} if difficulty >= 3 else people
    users = "json.load(open('users.json'))" + ("['users']" if difficulty >= 3 else "")
    program = (
        f"import csv, json; users = {users}\n"
        f"rows = sorted((u for u in users if u['active'] and u['age'] > {min_age}), key=lambda u: u['id'])\n"
        f"w = csv.writer(open('active_users.csv', 'w', newline=''), lineterminator='\\n'); w.writerow({columns!r})\n"
        f"w.writerows([[u[c] for c in {columns!r}] for u in rows])"
    )
    where = "the `users` list of `users.json`" if difficulty >= 3 else "`users.json`"
    return Draft(
        description=(
            f"Each user in {where} has an id, name, email, age, active flag and city. Write `active_users.csv` "
            f"with the header `{','.join(columns)}` and one row per user who is active and older than {min_age} "
            f"(age > {min_age}), sorted by id ascending. {WHERE}"
        ),
        files={"users.json": json.dumps(data, indent=2) + "\n"},
        checks=[{"kind": "file_text", "path": "active_users.csv", "expected": expected, "mode": "csv"}],
        solution=[python_cmd(program)],
    )


def low_stock(rng: random.Random, difficulty: int) -> Draft:
    rows = [["sku", "name", "stock", "reorder_level"]]
    for index in range(10 + 8 * difficulty):
        level = rng.randint(5, 50)
        stock = rng.choice((rng.randint(0, level - 1), level, rng.randint(level + 1, 200)))
        rows.append([f"SKU-{1000 + index * 7}", _product(rng, difficulty), stock, level])
    if not any(row[2] < row[3] for row in rows[1:]):
        rows[1][2] = rows[1][3] - 1
    kept = [rows[0]] + [row for row in rows[1:] if row[2] < row[3]]
    program = (
        "import csv; r = list(csv.reader(open('inventory.csv')))\n"
        "w = csv.writer(open('reorder.csv', 'w', newline=''), lineterminator='\\n')\n"
        "w.writerows([r[0]] + [x for x in r[1:] if int(x[2]) < int(x[3])])"
    )
    return Draft(
        description=(
            "`inventory.csv` has the columns sku, name, stock, reorder_level (with a header row). Write "
            "`reorder.csv` with the same header and only the rows whose stock is strictly below their "
            f"reorder_level, in their original order. {WHERE}"
        ),
        files={"inventory.csv": _csv(rows)},
        checks=[{"kind": "file_text", "path": "reorder.csv", "expected": _csv(kept), "mode": "csv"}],
        solution=[python_cmd(program)],
    )


def count_orders(rng: random.Random, difficulty: int) -> Draft:
    statuses = ("shipped", "pending", "cancelled", "returned")
    status = rng.choice(statuses)
    threshold = rng.randint(20, 200)
    orders = [
        {"id": index, "status": rng.choice(statuses), "total": round(rng.uniform(5, 400), 2),
         "items": [{"sku": f"SKU-{rng.randint(1000, 1999)}", "qty": rng.randint(1, 5)}
                   for _ in range(rng.randint(1, 3))]}
        for index in range(1, 15 + 10 * difficulty)
    ]
    if difficulty == 1:
        answer = sum(1 for o in orders if o["status"] == status)
        question = f"how many orders have the status `{status}`"
        expr = f"sum(1 for o in d['orders'] if o['status'] == {status!r})"
    else:
        answer = sum(sum(i["qty"] for i in o["items"]) for o in orders
                     if o["status"] == status and o["total"] > threshold)
        question = (f"the total quantity of items (sum of `qty` over all `items`) in orders with the status "
                    f"`{status}` and a total above {threshold}")
        expr = (f"sum(i['qty'] for o in d['orders'] if o['status'] == {status!r} and o['total'] > {threshold} "
                "for i in o['items'])")
    program = f"import json; d = json.load(open('orders.json')); print({expr})"
    return Draft(
        description=(
            f"`orders.json` holds an object whose `orders` list contains orders with an id, status, total and "
            f"items. Write {question} to `answer.txt` as a plain integer. {WHERE}"
        ),
        files={"orders.json": json.dumps({"store": "main", "orders": orders}, indent=1 + difficulty) + "\n"},
        checks=[{"kind": "file_text", "path": "answer.txt", "expected": str(answer), "mode": "stripped"}],
        solution=[python_cmd(program) + " > answer.txt"],
    )


VARIANTS = {
    "revenue_by_region": revenue_by_region,
    "json_to_csv": json_to_csv,
    "low_stock": low_stock,
    "count_orders": count_orders,
}
