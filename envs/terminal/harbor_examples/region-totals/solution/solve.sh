#!/bin/bash
cd /app
{
  echo "region,total"
  tail -n +2 data/sales.csv | awk -F, '{ total[$2] += $3 } END { for (r in total) printf "%s,%.2f\n", r, total[r] }' | sort
} > totals.csv
