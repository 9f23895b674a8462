#!/usr/bin/env node
// The rooms stay small enough to read (issue 30): no source file over 500 lines, no function
// over 150, tests and generated code aside. The exceptions, at most three, are the entries of
// docs/architecture.md's "Size exceptions" list (`path` or `path#function`), each with its reason.
//
//   node scripts/check-size.mjs          exits 1 and names every room over its limit
//   node scripts/check-size.mjs --list   prints the largest files and functions as well
import { readFileSync, readdirSync, existsSync } from "node:fs";
import { URL, fileURLToPath } from "node:url";
import { join, relative } from "node:path";

import ts from "typescript";

export const maxFileLines = 500;
export const maxFunctionLines = 150;
export const maxExceptions = 3;

const root = fileURLToPath(new URL("..", import.meta.url));

function sources(dir) {
  const out = [];
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) out.push(...sources(path));
    else if (/\.(ts|mts)$/.test(entry.name) && !/\.test\.ts$|\.d\.ts$/.test(entry.name)) {
      out.push(path);
    }
  }
  return out;
}

/** A function's name for the report: its declaration's, or the variable/property holding it. */
function nameOf(node) {
  if (node.name !== undefined) return node.name.getText();
  const parent = node.parent;
  if (parent !== undefined && (ts.isVariableDeclaration(parent) || ts.isPropertyAssignment(parent)))
    return parent.name.getText();
  if (ts.isConstructorDeclaration(node)) return "constructor";
  return "(anonymous)";
}

/** Every file and function of `src/` with its length in lines. */
export function measure(dir = join(root, "src")) {
  const files = [];
  const functions = [];
  for (const path of sources(dir)) {
    const text = readFileSync(path, "utf8");
    const file = relative(root, path);
    files.push({ file, lines: text.split("\n").length - (text.endsWith("\n") ? 1 : 0) });
    const source = ts.createSourceFile(path, text, ts.ScriptTarget.Latest, true);
    const visit = (node) => {
      if (ts.isFunctionLike(node) && "body" in node && node.body !== undefined) {
        const start = source.getLineAndCharacterOfPosition(node.getStart(source)).line;
        const end = source.getLineAndCharacterOfPosition(node.getEnd()).line;
        functions.push({ file, name: nameOf(node), lines: end - start + 1 });
      }
      ts.forEachChild(node, visit);
    };
    visit(source);
  }
  return { files, functions };
}

/** The exceptions docs/architecture.md lists: `path` or `path#function`. */
export function exceptions() {
  const doc = join(root, "docs", "architecture.md");
  if (!existsSync(doc)) return [];
  const text = readFileSync(doc, "utf8");
  const section = /^## Size exceptions\n([\s\S]*?)(?=^## |(?![\s\S]))/m.exec(text);
  if (section === null) return [];
  return [...section[1].matchAll(/^- `([^`]+)`/gm)].map((m) => m[1]);
}

export function violations({ files, functions }, allowed = exceptions()) {
  const out = [];
  for (const f of files) {
    if (f.lines > maxFileLines && !allowed.includes(f.file)) {
      out.push(`${f.file}: ${f.lines} lines (limit ${maxFileLines})`);
    }
  }
  for (const f of functions) {
    if (f.lines > maxFunctionLines && !allowed.includes(`${f.file}#${f.name}`)) {
      out.push(`${f.file}#${f.name}: ${f.lines} lines (limit ${maxFunctionLines})`);
    }
  }
  return out;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const measured = measure();
  const allowed = exceptions();
  if (process.argv.includes("--list")) {
    const top = (rows) => [...rows].sort((a, b) => b.lines - a.lines).slice(0, 15);
    for (const f of top(measured.files)) console.log(`${String(f.lines).padStart(5)}  ${f.file}`);
    console.log("");
    for (const f of top(measured.functions)) {
      console.log(`${String(f.lines).padStart(5)}  ${f.file}#${f.name}`);
    }
    console.log("");
  }
  const found = violations(measured, allowed);
  if (allowed.length > maxExceptions) {
    found.push(
      `docs/architecture.md lists ${allowed.length} size exceptions (at most ${maxExceptions})`,
    );
  }
  if (found.length > 0) {
    console.error(`size limits: ${found.length} over\n  ${found.join("\n  ")}`);
    process.exit(1);
  }
  console.log(
    `size limits: ${measured.files.length} files, ${measured.functions.length} functions within ` +
      `${maxFileLines}/${maxFunctionLines} lines (${allowed.length} exceptions)`,
  );
}
