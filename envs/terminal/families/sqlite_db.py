"""Family ``sqlite``: querying and changing a SQLite database (``sqlite3`` CLI or Python's module).

Ground truth comes from running the reference SQL on an in-memory copy of the generated database.
"""

from __future__ import annotations

import random
import sqlite3

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

DB = "shop.db"
CATEGORIES = ("books", "garden", "kitchen", "office", "sports", "toys")
STATUSES = ("paid", "shipped", "cancelled", "refunded")
SCHEMA = """CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT NOT NULL);
CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT NOT NULL, category TEXT NOT NULL, price REAL NOT NULL);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id),
  product_id INTEGER NOT NULL REFERENCES products(id), quantity INTEGER NOT NULL, status TEXT NOT NULL,
  order_date TEXT NOT NULL);
"""


def _sql_literal(value: object) -> str:
    return "'" + value.replace("'", "''") + "'" if isinstance(value, str) else repr(value)


def _build(rng: random.Random, difficulty: int) -> tuple[str, sqlite3.Connection, list[str]]:
    """The SQL script of a random shop, that database in memory, and the cities used."""
    cities = pick(rng, CITIES, 3 + difficulty)
    rows: list[str] = []
    for cid in range(1, 6 + 4 * difficulty):
        rows.append(f"INSERT INTO customers VALUES ({cid}, "
                    f"{_sql_literal(rng.choice(FIRST_NAMES) + ' ' + rng.choice(LAST_NAMES))}, {_sql_literal(rng.choice(cities))});")
    products = 5 + 3 * difficulty
    for pid in range(1, products + 1):
        rows.append(f"INSERT INTO products VALUES ({pid}, {_sql_literal(rng.choice(WORDS) + ' ' + rng.choice(WORDS))}, "
                    f"{_sql_literal(rng.choice(CATEGORIES))}, {rng.randint(100, 20000) / 100});")
    customers = 5 + 4 * difficulty
    for oid in range(1, 15 + 15 * difficulty):
        rows.append(f"INSERT INTO orders VALUES ({oid}, {rng.randint(1, customers)}, {rng.randint(1, products)}, "
                    f"{rng.randint(1, 6)}, {_sql_literal(rng.choice(STATUSES))}, "
                    f"'2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}');")
    script = SCHEMA + "\n".join(rows) + "\n"
    memory = sqlite3.connect(":memory:")
    memory.executescript(script)
    return script, memory, cities


def _setup() -> str:
    # One transaction: executescript would otherwise commit (and fsync) after every INSERT.
    return (f"python3 -I -S -c \"import sqlite3; c = sqlite3.connect('{DB}'); "
            f"c.executescript('BEGIN;' + open('shop.sql').read() + 'COMMIT;')\" && rm shop.sql\n")


def _run_sql(statements: str, output: str = "") -> str:
    """Oracle command running SQL through Python's sqlite3 module (the CLI may be absent)."""
    if output:
        program = (f"import sqlite3; r = sqlite3.connect('{DB}').execute({statements!r}).fetchone()[0]; "
                   f"print('%.2f' % r)")
        return python_cmd(program) + f" > {output}"
    return python_cmd(f"import sqlite3; c = sqlite3.connect('{DB}'); c.executescript({statements!r}); c.commit()")


def city_revenue(rng: random.Random, difficulty: int) -> Draft:
    script, memory, cities = _build(rng, difficulty)
    city = rng.choice(cities)
    statuses = ("paid", "shipped") if difficulty >= 2 else STATUSES
    # One sure order from that city, so the total is never empty.
    extra = (f"INSERT INTO customers VALUES ((SELECT MAX(id) + 1 FROM customers), 'Extra Buyer', {_sql_literal(city)});\n"
             f"INSERT INTO orders VALUES ((SELECT MAX(id) + 1 FROM orders), (SELECT MAX(id) FROM customers), 1, 2, "
             f"'paid', '2024-06-01');\n")
    script += extra
    memory.executescript(extra)
    status_list = ", ".join(_sql_literal(s) for s in statuses)
    query = (f"SELECT ROUND(SUM(o.quantity * p.price), 2) FROM orders o JOIN customers c ON c.id = o.customer_id "
             f"JOIN products p ON p.id = o.product_id WHERE c.city = {_sql_literal(city)} AND o.status IN ({status_list})")
    total = memory.execute(query).fetchone()[0]
    condition = " Count only orders whose status is `paid` or `shipped`." if difficulty >= 2 else ""
    return Draft(
        description=(
            f"`{DB}` is a SQLite database with the tables customers(id, name, city), products(id, name, "
            f"category, price) and orders(id, customer_id, product_id, quantity, status, order_date). Write the "
            f"total revenue (sum of quantity times the product's price) of the orders placed by customers from "
            f"{city} to `answer.txt`, as a number with two decimals.{condition} {WHERE}"
        ),
        files={"shop.sql": script},
        setup=_setup(),
        checks=[{"kind": "file_text", "path": "answer.txt", "expected": f"{total:.2f}", "mode": "number", "tol": 0.006}],
        solution=[_run_sql(query, "answer.txt")],
    )


def raise_prices(rng: random.Random, difficulty: int) -> Draft:
    script, memory, _ = _build(rng, difficulty)
    ordered = "SELECT DISTINCT category FROM products WHERE id IN (SELECT product_id FROM orders) ORDER BY 1"
    category = rng.choice([row[0] for row in memory.execute(ordered)])  # so some price always changes
    percent = rng.choice((5, 10, 12, 15, 20, 25))
    update = f"UPDATE products SET price = ROUND(price * {100 + percent} / 100.0, 2) WHERE category = {_sql_literal(category)}"
    if difficulty >= 3:
        update += " AND id IN (SELECT product_id FROM orders)"
    memory.execute(update)
    expected = [list(row) for row in memory.execute("SELECT id, price FROM products ORDER BY id")]
    scope = " that has been ordered at least once" if difficulty >= 3 else ""
    return Draft(
        description=(
            f"`{DB}` is a SQLite database with a table products(id, name, category, price) and a table "
            f"orders(id, customer_id, product_id, quantity, status, order_date). Raise the price of every "
            f"product in the category `{category}`{scope} by {percent}%, rounded to 2 decimals. Leave all other "
            f"prices unchanged. {WHERE}"
        ),
        files={"shop.sql": script},
        setup=_setup(),
        checks=[{"kind": "sqlite_query", "db": DB, "query": "SELECT id, price FROM products ORDER BY id",
                 "expected": expected, "tol": 0.006}],
        solution=[_run_sql(update)],
    )


def delete_orders(rng: random.Random, difficulty: int) -> Draft:
    script, memory, _ = _build(rng, difficulty)
    status = rng.choice(("cancelled", "refunded"))
    cutoff = f"2024-{rng.randint(4, 10):02d}-01"
    condition = f"status = {_sql_literal(status)}" + (f" AND order_date < '{cutoff}'" if difficulty >= 2 else "")
    if not memory.execute(f"SELECT COUNT(*) FROM orders WHERE {condition}").fetchone()[0]:
        row = f"(SELECT MAX(id) + 1 FROM orders), 1, 1, 1, {_sql_literal(status)}, '2024-01-15'"
        script += f"INSERT INTO orders VALUES ({row});\n"
        memory.execute(f"INSERT INTO orders VALUES ({row})")
    memory.execute(f"DELETE FROM orders WHERE {condition}")
    expected = [list(row) for row in memory.execute("SELECT id FROM orders ORDER BY id")]
    before = f" placed before {cutoff}" if difficulty >= 2 else ""
    return Draft(
        description=(
            f"`{DB}` is a SQLite database with a table orders(id, customer_id, product_id, quantity, status, "
            f"order_date) where order_date is `YYYY-MM-DD`. Delete every order with the status `{status}`{before}. "
            f"Keep all other orders. {WHERE}"
        ),
        files={"shop.sql": script},
        setup=_setup(),
        checks=[
            {"kind": "sqlite_query", "db": DB, "query": "SELECT id FROM orders ORDER BY id", "expected": expected},
            {"kind": "sqlite_query", "db": DB, "query": "SELECT COUNT(*) FROM customers",
             "expected": [list(memory.execute("SELECT COUNT(*) FROM customers").fetchone())]},
        ],
        solution=[_run_sql(f"DELETE FROM orders WHERE {condition}")],
    )


def category_view(rng: random.Random, difficulty: int) -> Draft:
    script, memory, _ = _build(rng, difficulty)
    view = rng.choice(("category_sales", "sales_by_category", "category_units"))
    where = " WHERE o.status != 'cancelled'" if difficulty >= 2 else ""
    create = (f"CREATE VIEW {view} AS SELECT p.category AS category, SUM(o.quantity) AS units FROM orders o "
              f"JOIN products p ON p.id = o.product_id{where} GROUP BY p.category")
    memory.execute(create)
    query = f"SELECT category, units FROM {view} ORDER BY category"
    expected = [list(row) for row in memory.execute(query)]
    checks: list[dict] = [
        {"kind": "sqlite_query", "db": DB, "query": f"SELECT type FROM sqlite_master WHERE name = '{view}'",
         "expected": [["view"]]},
        {"kind": "sqlite_query", "db": DB, "query": query, "expected": expected},
    ]
    extra, statements = "", create
    if difficulty >= 3:
        extra = " Also create an index named `idx_orders_product` on orders(product_id)."
        statements += "; CREATE INDEX idx_orders_product ON orders(product_id)"
        checks.append({"kind": "sqlite_query", "db": DB, "expected": [["orders", "product_id"]],
                       "query": "SELECT m.tbl_name, i.name FROM sqlite_master m, pragma_index_info(m.name) i "
                                "WHERE m.type = 'index' AND m.name = 'idx_orders_product'"})
    skip = " Ignore cancelled orders." if difficulty >= 2 else ""
    return Draft(
        description=(
            f"`{DB}` is a SQLite database with the tables products(id, name, category, price) and orders(id, "
            f"customer_id, product_id, quantity, status, order_date). Create a view named `{view}` with the "
            f"columns `category` and `units` (the total quantity ordered of that category's products), one row "
            f"per category that has orders.{skip}{extra} {WHERE}"
        ),
        files={"shop.sql": script},
        setup=_setup(),
        checks=checks,
        solution=[_run_sql(statements)],
    )


def export_loyal(rng: random.Random, difficulty: int) -> Draft:
    script, memory, _ = _build(rng, difficulty)
    counts = sorted({row[0] for row in memory.execute("SELECT COUNT(*) FROM orders GROUP BY customer_id")})
    minimum = counts[len(counts) // 2] if len(counts) > 1 else counts[0]
    query = (f"SELECT c.id, c.name, COUNT(*) FROM customers c JOIN orders o ON o.customer_id = c.id "
             f"GROUP BY c.id HAVING COUNT(*) >= {minimum} ORDER BY c.id")
    rows = [["id", "name", "orders"]] + [[str(v) for v in row] for row in memory.execute(query)]
    program = (f"import csv, sqlite3; rows = sqlite3.connect('{DB}').execute({query!r}).fetchall(); "
               "w = csv.writer(open('loyal.csv', 'w', newline=''), lineterminator='\\n'); "
               "w.writerow(['id', 'name', 'orders']); w.writerows(rows)")
    return Draft(
        description=(
            f"`{DB}` is a SQLite database with the tables customers(id, name, city) and orders(id, "
            f"customer_id, product_id, quantity, status, order_date). Export every customer with at least "
            f"{minimum} orders to `loyal.csv`: a header row `id,name,orders`, then one row per customer (their "
            f"id, name and number of orders), sorted by id. {WHERE}"
        ),
        files={"shop.sql": script},
        setup=_setup(),
        checks=[{"kind": "file_text", "path": "loyal.csv", "expected": "\n".join(",".join(r) for r in rows),
                 "mode": "csv"}],
        solution=[python_cmd(program)],
    )


VARIANTS = {
    "city_revenue": city_revenue,
    "raise_prices": raise_prices,
    "delete_orders": delete_orders,
    "category_view": category_view,
    "export_loyal": export_loyal,
}
