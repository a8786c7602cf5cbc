module github.com/gorgo-llm/gorgo

go 1.26.0

require (
	golang.org/x/sync v0.25.0
	gopkg.in/yaml.v3 v3.0.1
)

require github.com/cespare/xxhash/v2 v2.3.0 // indirect
