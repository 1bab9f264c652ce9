"""Chat rendering, loss masks, the ReTerm-10K schema and Grain pipelines."""
