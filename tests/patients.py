"""A steward's own table, generated at test time: the project ships no such file.

Issue 22's example: 4,000 patients with age, sex, a 5-digit ZIP code, a diagnosis, an income and an
e-mail address, skewed as such data is (more older patients, a few ZIP codes holding most people, a
long-tailed income with some zeros, a handful of very common diagnoses, a rare third sex category).

    .venv/bin/python -m tests.patients /tmp/walk/patients.csv     # write one to walk the quick start
"""

import sys
from pathlib import Path

import numpy as np
import pandas as pd

_DIAGNOSES = [
    "I10", "E11.9", "J06.9", "M54.5", "F32.9", "E78.5", "K21.9", "J45.909", "F41.1", "N39.0",
    "I25.10", "M17.11", "E66.9", "G43.909", "R51", "Z00.00", "L40.0", "I48.91", "J44.9", "N18.3",
    "K58.9", "H40.9", "C50.911", "E03.9", "M81.0", "G47.33", "B20", "F90.0", "K76.0", "D50.9",
]
_FIRST = ["anna", "ben", "chloe", "david", "emma", "farid", "grace", "hugo", "ines", "jack", "kate", "liam",
          "maria", "noah", "olga", "paul", "quinn", "rosa", "sam", "tara", "uma", "victor", "wen", "yusuf", "zoe"]
_LAST = ["murphy", "kelly", "byrne", "ryan", "walsh", "smith", "garcia", "nguyen", "kim", "okafor", "rossi",
         "schmidt", "novak", "silva", "khan", "cohen", "larsen", "dubois", "tanaka", "oconnor"]
_DOMAINS = ["gmail.com", "yahoo.com", "outlook.com", "icloud.com", "example.org"]


def patients(rows: int = 4000, seed: int = 22) -> pd.DataFrame:
    """The table, every column as the text a CSV holds (ZIP codes keep their leading zeros)."""
    rng = np.random.default_rng(seed)
    age = np.clip(np.round(18 + 77 * rng.beta(2.4, 1.9, size=rows)), 18, 95).astype(int)
    sex = rng.choice(["F", "M", "X"], size=rows, p=[0.527, 0.468, 0.005])
    # 60 ZIP codes in three areas (two with a leading zero), Zipf-like: a few hold most patients.
    prefixes = rng.choice(["021", "024", "606"], size=60, p=[0.45, 0.25, 0.30])
    codes = np.unique([f"{p}{rng.integers(0, 100):02d}" for p in prefixes])
    weights = 1.0 / np.arange(1, len(codes) + 1) ** 1.1
    zip_code = rng.choice(rng.permutation(codes), size=rows, p=weights / weights.sum())
    weights = 1.0 / np.arange(1, len(_DIAGNOSES) + 1) ** 0.9
    diagnosis = rng.choice(_DIAGNOSES, size=rows, p=weights / weights.sum())
    # Income: log-normal around 48,000, 6 % without income, a Pareto tail of high earners.
    income = np.round(rng.lognormal(np.log(48_000), 0.7, size=rows), -1)
    income[rng.random(rows) < 0.06] = 0
    rich = rng.random(rows) < 0.01
    income[rich] = np.round(200_000 * (1 + rng.pareto(1.6, size=int(rich.sum()))), -2)
    email = [
        f"{rng.choice(_FIRST)}.{rng.choice(_LAST)}{rng.integers(1, 1000)}@{rng.choice(_DOMAINS)}" for _ in range(rows)
    ]
    return pd.DataFrame(
        {
            "age": age.astype(str),
            "sex": sex,
            "zip": zip_code,
            "diagnosis": diagnosis,
            "income": income.astype(np.int64).astype(str),
            "email": email,
        }
    )


def write_patients_csv(path: Path, rows: int = 4000, seed: int = 22) -> Path:
    """Write the table as a comma-separated CSV with a header; returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    patients(rows, seed).to_csv(path, index=False)
    return path


if __name__ == "__main__":
    print(write_patients_csv(Path(sys.argv[1])))
