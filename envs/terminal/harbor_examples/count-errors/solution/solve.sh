#!/bin/bash
# The level is the second field; a WARN line may mention ERROR in its message.
awk '$2 == "ERROR"' /app/server.log | wc -l > /app/reports/error_count.txt
