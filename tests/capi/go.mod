// Cluster API, at the version the extension is proven against: a test-bed input only (its
// own CRDs for the management cluster of the suites), never part of the product.
module inplace.dev/tests/capi

go 1.26

require sigs.k8s.io/cluster-api v1.14.2
