#!/bin/bash
# Harbor verifier: compares /app/totals.csv with the expected table and writes /logs/verifier/reward.json.
if diff -q /tests/expected.csv /app/totals.csv > /dev/null 2>&1; then
  echo '{"reward": 1.0}' > /logs/verifier/reward.json
else
  diff /tests/expected.csv /app/totals.csv
  echo '{"reward": 0.0}' > /logs/verifier/reward.json
fi
