// The composition root wires, nothing else (issue 30): src/app.ts and src/app/ construct things
// and connect them; what a request (or a background round) runs lives in the rooms below, and
// none of those reaches back up into the root.
import { readFileSync, readdirSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import ts from "typescript";
import { describe, expect, it } from "vitest";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
const src = join(root, "src");

function sources(dir: string): string[] {
  const out: string[] = [];
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) out.push(...sources(path));
    else if (/\.ts$/.test(entry.name) && !/\.test\.ts$|\.d\.ts$/.test(entry.name)) out.push(path);
  }
  return out;
}

const parse = (path: string) =>
  ts.createSourceFile(path, readFileSync(path, "utf8"), ts.ScriptTarget.Latest, true);

/** The module a relative import names, as a path under the repository (`src/app/chat.ts`). */
function importedPath(from: string, specifier: string): string | undefined {
  if (!specifier.startsWith(".")) return undefined;
  return relative(root, resolve(dirname(from), specifier)).replace(/\.js$/, ".ts");
}

const wiringFiles = [
  join(src, "app.ts"),
  ...readdirSync(join(src, "app"))
    .filter((name) => name.endsWith(".ts") && !name.endsWith(".test.ts"))
    .map((name) => join(src, "app", name)),
];

const isRoot = (path: string) => path === "src/app.ts" || path.startsWith("src/app/");

describe("the composition root", () => {
  it("is imported by no room below it (domain, transports, adapters, runtime)", () => {
    const below = ["domain", "connect", "rest", "adapters", "runtime", "clients", "schema"];
    const offenders: string[] = [];
    for (const room of below) {
      for (const path of sources(join(src, room))) {
        for (const statement of parse(path).statements) {
          if (!ts.isImportDeclaration(statement) && !ts.isExportDeclaration(statement)) continue;
          const spec = statement.moduleSpecifier;
          if (spec === undefined || !ts.isStringLiteral(spec)) continue;
          const target = importedPath(path, spec.text);
          if (target !== undefined && isRoot(target)) {
            offenders.push(`${relative(root, path)} imports ${target}`);
          }
        }
      }
    }
    expect(offenders).toEqual([]);
  });

  it("holds no function a request calls: no closure of src/app calls an adapter's function", () => {
    // A wiring function may call an adapter at start-up (migrate, read a secret); a closure it
    // hands on runs later, on a request or a background round: that is a port's implementation,
    // and belongs in the adapter (a factory the root calls once).
    const offenders: string[] = [];
    for (const path of wiringFiles) {
      const source = parse(path);
      const file = relative(root, path);
      const adapterNames = new Set<string>();
      for (const statement of source.statements) {
        if (!ts.isImportDeclaration(statement) || statement.importClause?.isTypeOnly) continue;
        const target = importedPath(path, (statement.moduleSpecifier as ts.StringLiteral).text);
        if (target === undefined || !target.startsWith("src/adapters/")) continue;
        const clause = statement.importClause;
        if (clause?.name !== undefined) adapterNames.add(clause.name.text);
        const bindings = clause?.namedBindings;
        if (bindings !== undefined && ts.isNamespaceImport(bindings)) {
          adapterNames.add(bindings.name.text);
        } else if (bindings !== undefined) {
          for (const element of bindings.elements) {
            if (!element.isTypeOnly) adapterNames.add(element.name.text);
          }
        }
      }
      const visit = (node: ts.Node, depth: number) => {
        const inner = ts.isFunctionLike(node) ? depth + 1 : depth;
        if (ts.isCallExpression(node) && depth > 1) {
          let callee: ts.Expression = node.expression;
          while (ts.isPropertyAccessExpression(callee)) callee = callee.expression;
          if (ts.isIdentifier(callee) && adapterNames.has(callee.text)) {
            const line = source.getLineAndCharacterOfPosition(node.getStart(source)).line + 1;
            offenders.push(`${file}:${line} ${node.expression.getText(source)}`);
          }
        }
        ts.forEachChild(node, (child) => visit(child, inner));
      };
      visit(source, 0);
    }
    expect(offenders).toEqual([]);
  });

  it("answers no request itself: of the transports it takes only their factories (create*)", () => {
    // Refusing a request (503 while draining, 408, an error body) is the transports' or the
    // process runtime's job; the root only builds the handler and hands it to the listener.
    const transports = ["src/rest/", "src/connect/", "src/server.ts"];
    const offenders: string[] = [];
    for (const path of wiringFiles) {
      for (const statement of parse(path).statements) {
        if (!ts.isImportDeclaration(statement) || statement.importClause?.isTypeOnly) continue;
        const target = importedPath(path, (statement.moduleSpecifier as ts.StringLiteral).text);
        if (target === undefined || !transports.some((room) => target.startsWith(room))) continue;
        const clause = statement.importClause;
        const bindings = clause?.namedBindings;
        const names =
          bindings === undefined
            ? []
            : ts.isNamespaceImport(bindings)
              ? [`* as ${bindings.name.text}`]
              : bindings.elements.filter((e) => !e.isTypeOnly).map((e) => e.name.text);
        if (clause?.name !== undefined) names.push(clause.name.text);
        for (const name of names) {
          if (!/^create[A-Z]/.test(name)) offenders.push(`${relative(root, path)}: ${name}`);
        }
      }
    }
    expect(offenders).toEqual([]);
  });
});
