"""The Offtake operator: reconciles ConsumerPipeline resources."""
