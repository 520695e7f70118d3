"""Result files: the CSV / JSON schema, the writer, compare, the gate's rows and tolerances, and the capacity
frontier read from the rows."""
