"""Structured output: response_format json_object / json_schema, enforced while generating."""
