"""What gnnsched believes and where it reads it from: facts about a job that a tenant cannot write (the GNNJob's
status subresource, the node agent's own measurements), and calibration one namespace cannot move for another."""
