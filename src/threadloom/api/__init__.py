"""The GraphQL API: types, loaders, mutations, auth, errors. Resolvers stay thin."""
