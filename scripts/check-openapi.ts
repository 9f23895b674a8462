// `npm run check:openapi`: validates the generated document (src/rest/document.ts, from the
// route table src/rest/routes/ and the body schemas src/schema) as an OpenAPI 3.1 document (the
// official 3.1 schema, through @seriousme/openapi-schema-validator), then what that schema
// cannot see: every local $ref resolves, operationIds are unique, and every error code a
// response lists exists in src/domain/errors.ts with that response's status and type.
// Exit 1 with the errors.
import { Validator } from "@seriousme/openapi-schema-validator";
import { pathToFileURL } from "node:url";
import { wireOf } from "../src/connect/error-codes.js";
import { isErrorCode } from "../src/domain/errors.js";
import { openApiDocument } from "../src/rest/routes/index.js";

/** The problems of `document` as an OpenAPI 3.1 description of this gateway ([] when none). */
export async function checkOpenApi(document: object): Promise<string[]> {
  const problems: string[] = [];
  // A copy: the validator annotates what it is given.
  const copy = JSON.parse(JSON.stringify(document)) as Record<string, unknown>;
  const validator = new Validator();
  const result = await validator.validate(copy);
  if (copy.openapi === undefined || !String(copy.openapi).startsWith("3.1.")) {
    problems.push(`openapi: expected 3.1.x, got ${String(copy.openapi)}`);
  }
  if (!result.valid) {
    const errors = result.errors;
    if (typeof errors === "string") problems.push(errors);
    else
      for (const e of errors ?? [])
        problems.push(
          `${e.instancePath || "/"}: ${e.message ?? e.keyword} ${JSON.stringify(e.params)}`,
        );
  }
  const root = JSON.parse(JSON.stringify(document)) as unknown;
  const operationIds = new Set<string>();
  walk(root, "", (node, at) => {
    const target = node.$ref;
    if (typeof target === "string") {
      if (!target.startsWith("#/")) problems.push(`${at}: external $ref ${target}`);
      else if (resolvePointer(root, target.slice(1)) === undefined)
        problems.push(`${at}: $ref ${target} does not resolve`);
    }
    if (/^\/paths\/[^/]+\/(get|put|post|delete|patch|head|options)$/.test(at)) {
      const id = node.operationId;
      if (typeof id !== "string") problems.push(`${at}: no operationId`);
      else if (operationIds.has(id)) problems.push(`${at}: duplicate operationId ${id}`);
      else operationIds.add(id);
    }
    const status =
      /\/responses\/(\d{3})\/content\/application~1json\/schema\/properties\/error\/properties$/.exec(
        at,
      )?.[1];
    if (status !== undefined) {
      const code = node.code as { const?: string; enum?: string[] } | undefined;
      const type = (node.type as { const?: string } | undefined)?.const;
      for (const c of code?.enum ?? (code?.const === undefined ? [] : [code.const])) {
        const known = isErrorCode(c) ? wireOf(c) : undefined;
        if (known === undefined)
          problems.push(`${at}: error code '${c}' is not in src/domain/errors.ts`);
        // A dialect's error shape (DESIGN.md section 9) has its own types: the status must match.
        else if (known.status !== Number(status) || (type !== undefined && known.type !== type))
          problems.push(
            `${at}: '${c}' is ${known.status} ${known.type} in src/domain/errors.ts, not ${status} ${type}`,
          );
      }
    }
  });
  return problems;
}

function walk(
  node: unknown,
  at: string,
  visit: (node: Record<string, unknown>, at: string) => void,
): void {
  if (Array.isArray(node)) node.forEach((n, i) => walk(n, `${at}/${i}`, visit));
  else if (typeof node === "object" && node !== null) {
    visit(node as Record<string, unknown>, at);
    for (const [key, value] of Object.entries(node))
      walk(value, `${at}/${key.replaceAll("~", "~0").replaceAll("/", "~1")}`, visit);
  }
}

/** The value at a JSON pointer (`/components/schemas/X`), undefined when there is none. */
export function resolvePointer(root: unknown, pointer: string): unknown {
  let node = root;
  for (const raw of pointer.split("/").slice(1)) {
    const key = decodeURIComponent(raw).replaceAll("~1", "/").replaceAll("~0", "~");
    if (typeof node !== "object" || node === null || !Object.hasOwn(node, key)) return undefined;
    node = (node as Record<string, unknown>)[key];
  }
  return node;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  const document = openApiDocument();
  const problems = await checkOpenApi(document);
  if (problems.length > 0) {
    console.error(`the generated document is not a valid OpenAPI 3.1 description:`);
    for (const p of problems) console.error(`  ${p}`);
    process.exit(1);
  }
  const paths = Object.keys(document.paths as object).length;
  console.log(`openapi: valid OpenAPI 3.1 (${paths} paths)`);
}
