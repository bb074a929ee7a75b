// GraphQL Code Generator: the schema plus our operations -> one file of types and typed documents.
import type { CodegenConfig } from "@graphql-codegen/cli";

const config: CodegenConfig = {
  schema: "../../schema/schema.graphql",
  documents: "src/operations.graphql",
  generates: {
    "src/generated/graphql.ts": {
      plugins: ["typescript-operations", "typed-document-node"], // operations emits the enums it uses
      config: {
        enumsAsTypes: true, // string unions: no runtime code, and they match the JSON on the wire
        useTypeImports: true,
        scalars: { DateTime: "string", JSON: "unknown" },
      },
    },
  },
  silent: true,
};

export default config;
