import { Ajv2020 } from "ajv/dist/2020.js";
import addFormatsModule from "ajv-formats";
import { resolvePointer } from "../../scripts/check-openapi.js";
import { openApiDocument } from "../../src/rest/routes/index.js";

/**
 * The generated OpenAPI document as tests check answers against it: every object schema of
 * `components.schemas` that says nothing about additional properties gets
 * `additionalProperties: false`, so a field the gateway answers but the document does not
 * describe fails (the published document stays open for clients, as JSON APIs grow).
 */

export type Schema = Record<string, unknown>;

export const doc = openApiDocument() as Schema;

const addFormats = ((addFormatsModule as unknown as { default?: unknown }).default ??
  addFormatsModule) as (ajv: Ajv2020) => void;

function strictCopy(): Schema {
  const copy = JSON.parse(JSON.stringify(doc)) as Schema;
  const close = (node: unknown): void => {
    if (Array.isArray(node)) node.forEach(close);
    else if (typeof node === "object" && node !== null) {
      const n = node as Schema;
      if (typeof n.properties === "object" && !("additionalProperties" in n))
        n.additionalProperties = false;
      for (const value of Object.values(n)) close(value);
    }
  };
  close((copy.components as Schema).schemas);
  return copy;
}

export const ajv = new Ajv2020({ strict: false, allErrors: true });
addFormats(ajv);
ajv.addSchema(strictCopy(), "openapi.json");

const validators = new Map<string, ReturnType<typeof ajv.compile>>();

/** The validator of the (strict) schema at a JSON pointer of the document. */
export function validatorAt(pointer: string) {
  let v = validators.get(pointer);
  if (v === undefined) {
    v = ajv.getSchema(`openapi.json#${pointer}`);
    if (v === undefined) throw new Error(`no schema at ${pointer}`);
    validators.set(pointer, v);
  }
  return v;
}

export const escape = (key: string) => key.replaceAll("~", "~0").replaceAll("/", "~1");

/** Follows a `$ref` of the document to its object (and its pointer). */
export function deref(node: Schema, pointer: string): { node: Schema; pointer: string } {
  if (typeof node.$ref === "string") {
    const target = node.$ref.slice(1);
    return deref(resolvePointer(doc, target) as Schema, target);
  }
  return { node, pointer };
}

const templates = Object.keys(doc.paths as Schema).map((template) => ({
  template,
  pattern: new RegExp(`^${template.replaceAll(/\{[^}]+\}/g, "[^/]+")}$`),
}));

/**
 * The problem of one JSON answer the gateway gave (undefined when it conforms): its status must
 * be documented for the operation (or, off every route, be RouteNotFound / MethodNotAllowed) and
 * its body must match the schema.
 */
export function answerProblem(
  method: string,
  pathname: string,
  status: number,
  body: unknown,
): string | undefined {
  const label = `${method} ${pathname} ${status}`;
  const route = templates.find((t) => t.pattern.test(pathname))?.template;
  const operation =
    route === undefined
      ? undefined
      : ((doc.paths as Record<string, Schema>)[route]?.[method.toLowerCase()] as
          Schema | undefined);
  let response: { node: Schema; pointer: string };
  if (operation === undefined) {
    if (status !== 404 && status !== 405) return `${label}: no such operation in the document`;
    const name = status === 405 ? "MethodNotAllowed" : "RouteNotFound";
    response = deref({ $ref: `#/components/responses/${name}` }, "");
  } else {
    const raw = (operation.responses as Schema)[String(status)] as Schema | undefined;
    if (raw === undefined) return `${label}: status not documented`;
    response = deref(
      raw,
      `/paths/${escape(route ?? "")}/${method.toLowerCase()}/responses/${status}`,
    );
  }
  const content = (response.node.content ?? {}) as Schema;
  if (content["application/json"] === undefined) return `${label}: JSON not documented`;
  const validate = validatorAt(`${response.pointer}/content/application~1json/schema`);
  if (validate(body)) return undefined;
  return `${label}: ${ajv.errorsText(validate.errors)}: ${JSON.stringify(body).slice(0, 400)}`;
}
