"""English date formats for the admin: times to the second, ISO-like (issue 10: operators
compare them with log lines and Redis entry IDs; "Dec. 2, 2026, 7:09 p.m." is too coarse)."""
DATETIME_FORMAT = "Y-m-d H:i:s T"
SHORT_DATETIME_FORMAT = "Y-m-d H:i:s"
TIME_FORMAT = "H:i:s"
DATE_FORMAT = "Y-m-d"
SHORT_DATE_FORMAT = "Y-m-d"
