module example.com/offtake-sidecar

go 1.21
