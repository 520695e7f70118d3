"""Result files: the CSV / JSON schema, the writer, `--like`, compare, the gate and its tolerances."""
