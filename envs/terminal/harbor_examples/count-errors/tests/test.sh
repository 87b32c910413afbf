#!/bin/bash
# Harbor verifier: runs the checks and writes the reward to /logs/verifier/reward.txt.
python3 /tests/test_outputs.py
if [ $? -eq 0 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
