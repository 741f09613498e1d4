"""The models against the OpenAPI document: every model has exactly its schema's
properties, and requires nothing the schema does not. A change of the spec that the
models do not follow fails here."""

import inspect
import json
import os
from pathlib import Path

import pytest

from agentq_client import models

# The committed document: `AGENTQ_OPENAPI` names it when the suite runs from a copy of
# the package (as cli/tests/it/clients.rs runs it), else it is the checkout's.
REPO_SPEC = Path(os.environ.get("AGENTQ_OPENAPI")
                 or Path(__file__).resolve().parents[3] / "api" / "openapi.json")


@pytest.fixture(scope="module")
def document():
    return json.loads(REPO_SPEC.read_text())


def resolve(doc, schema):
    while "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def flatten(doc, schema):
    """(properties, required) of a schema, through `$ref` and `allOf`."""
    schema = resolve(doc, schema)
    props, required = dict(schema.get("properties", {})), set(schema.get("required", []))
    for part in schema.get("allOf", []):
        p, r = flatten(doc, part)
        props.update(p)
        required |= r
    return props, required


def schema_of(doc, cls):
    """The schema a model mirrors: by name, or (for routes that name their answer only
    by where it is) the answer of `GET /v1/approvals`."""
    schemas = doc["components"]["schemas"]
    if cls.__schema__ in schemas:
        return schemas[cls.__schema__]
    op = doc["paths"].get("/v1/approvals", {}).get("get")
    if op is None:
        return None
    page = resolve(doc, op["responses"]["200"]["content"]["application/json"]["schema"])
    if cls is models.ApprovalPage:
        return page
    if cls is models.Approval:
        return flatten(doc, page)[0]["approvals"]["items"]
    return None


MODELS = [cls for _, cls in inspect.getmembers(models, inspect.isclass)
          if issubclass(cls, models.Model) and cls.__schema__]


@pytest.mark.parametrize("cls", MODELS, ids=lambda c: c.__name__)
def test_model_fields_are_the_schemas(document, cls):
    schema = schema_of(document, cls)
    if schema is None:
        pytest.skip(f"{cls.__schema__} is not in this server's document yet")
    props, required = flatten(document, schema)
    fields = cls.model_fields
    assert set(fields) == set(props), (
        f"{cls.__name__} vs {cls.__schema__}: missing {sorted(set(props) - set(fields))}, "
        f"extra {sorted(set(fields) - set(props))}")
    # A model never requires what the server may leave out.
    model_required = {n for n, f in fields.items() if f.is_required()}
    assert model_required <= required, (
        f"{cls.__name__}: requires {sorted(model_required - required)}, the spec does not")


def test_a_spec_change_is_caught(document):
    # The check above must be able to fail: a property the model lacks is found.
    doc = json.loads(json.dumps(document))
    doc["components"]["schemas"]["FileEntry"]["properties"]["mode"] = {"type": "string"}
    props, _ = flatten(doc, doc["components"]["schemas"]["FileEntry"])
    assert set(models.FileEntry.model_fields) != set(props)


def test_every_answer_schema_used_by_the_client_has_a_model(document):
    # The answers the client decodes: each operation's 2xx JSON schema names a model.
    names = {cls.__schema__ for cls in MODELS}
    used = {
        "/v1/sessions": ["post"], "/v1/sessions/{id}": ["get"],
        "/v1/sessions/{id}/cancel": ["post"], "/v1/sessions/{id}/retry": ["post"],
        "/v1/sessions/{id}/messages": ["get", "post"], "/v1/sessions/{id}/files": ["get"],
        "/v1/sessions/{id}/approvals": ["post"], "/v1/sessions/cancel": ["post"],
        "/v1/sessions/retry": ["post"], "/v1/batches": ["get", "post"],
        "/v1/batches/{id}": ["get"], "/v1/batches/{id}/cancel": ["post"],
    }
    for path, methods in used.items():
        for method in methods:
            for status, resp in document["paths"][path][method]["responses"].items():
                if not status.startswith("2"):
                    continue
                schema = resp.get("content", {}).get("application/json", {}).get("schema")
                if schema and "$ref" in schema:
                    name = schema["$ref"].rsplit("/", 1)[1]
                    assert name in names, f"{method} {path} answers {name}: no model"
